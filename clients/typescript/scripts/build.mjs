// Build dist/ (the package's JavaScript, for node >= 20) and dist-test/ (the tests, for the
// same) from the TypeScript sources with node's own type stripper: the sources use erasable
// syntax only, so stripping the types is the whole compilation. Needs node >= 22.18 (where
// node:module has stripTypeScriptTypes); types are not checked here (no tsc on this machine).
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import * as module from "node:module";

if (typeof module.stripTypeScriptTypes !== "function") {
  console.error(`build: node ${process.version} has no stripTypeScriptTypes (node >= 22.18 has)`);
  process.exit(2);
}
process.removeAllListeners("warning"); // "stripTypeScriptTypes is experimental", once per file

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
// source dir -> output dir, and how relative imports between them are renamed
const TREES = [
  { from: "src", to: "dist", rename: [] },
  { from: "test", to: "dist-test", rename: [["../src/", "../dist/"]] },
];

for (const tree of TREES) {
  const out = join(root, tree.to);
  rmSync(out, { recursive: true, force: true });
  mkdirSync(out, { recursive: true });
  for (const name of readdirSync(join(root, tree.from))) {
    if (!name.endsWith(".ts")) continue;
    const source = readFileSync(join(root, tree.from, name), "utf8");
    let js = module.stripTypeScriptTypes(source, { mode: "strip" });
    // Relative specifiers name the .ts files (as node's type stripping requires); the built
    // files import each other's .js.
    js = js.replace(/(\bfrom\s*|\bimport\s*\(\s*|\bimport\s+)(["'])(\.{1,2}\/[^"']*)\.ts\2/g, (_, lead, q, spec) => {
      let renamed = spec;
      for (const [a, b] of tree.rename) if (renamed.startsWith(a)) renamed = b + renamed.slice(a.length);
      return `${lead}${q}${renamed}.js${q}`;
    });
    writeFileSync(join(out, name.replace(/\.ts$/, ".js")), js);
  }
}
