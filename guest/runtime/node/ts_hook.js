// TypeScript in JavaScript code (docs/design.md, "TypeScript"): `language="typescript"` is the
// javascript runtime, and code that does not parse as JavaScript gets its types stripped by
// node's own `module.stripTypeScriptTypes` (node >= 22.13) before it runs. Plain JavaScript runs
// exactly as written and never loads the stripper (a WebAssembly module: ~25 ms and ~16 MB the
// first time in a process). Strip mode blanks the types in place, so every line and column of the
// user's code stays where it was: errors point at the user's lines. What strip mode refuses
// (enums, namespaces, parameter properties) is transformed instead, with a source map node applies
// to stack traces. When neither gives anything else, the code is left as it was, so that V8's own
// SyntaxError, with its line, is what the user sees.
//
// Used by the one-shot runs (a load hook on the code file, installed by the pre-start preload and
// by tools_global.js) and by the session driver (each cell, guest/repl/driver.js). A node without
// the API (a template's own older node) runs the code as before.
'use strict';
const Module = require('module');
const vm = require('vm');

const available = typeof Module.stripTypeScriptTypes === 'function';

// Node warns once per process that the stripper is experimental: the user's stderr is theirs, and
// that line is about our use, not their code.
function quietly(fn) {
  const emitWarning = process.emitWarning;
  process.emitWarning = function (warning, ...rest) {
    const text = warning instanceof Error ? warning.message : String(warning);
    if (/stripTypeScriptTypes|[Tt]ype [Ss]tripping|transform-types/.test(text)) return undefined;
    return Reflect.apply(emitWarning, this, [warning, ...rest]);
  };
  try {
    return fn();
  } finally {
    process.emitWarning = emitWarning;
  }
}

// The line of a SyntaxError's position: V8 and node's stripper put "FILE:LINE" on the first line
// of the stack; 0 when it is not there.
function errorLine(e) {
  const m = /^[^\n]*:(\d+)\n/.exec(String(e && e.stack));
  return m ? Number(m[1]) : 0;
}

// Where V8 fails to parse the source as JavaScript (its line, at least 1), or 0 when it parses:
// as a script, or as the body of an async function, which a module's top-level await and a
// CommonJS module's top-level return parse as (without loading the stripper for them). A
// module's import/export declarations parse as neither: such code goes to the stripper, which
// gives it back unchanged when it has no types.
function javaScriptError(source, filename) {
  let line = 0;
  for (const text of [source, `(async function () {${source}\n})`]) {
    try {
      new vm.Script(text, { filename });
      return 0;
    } catch (e) {
      if (!(e instanceof SyntaxError)) return 0; // not a parse failure: leave it to node
      line = line || errorLine(e) || 1;
    }
  }
  return line;
}

// A SyntaxError that reads as V8's of the user's code: "FILE:LINE", the line, the caret (the
// stripper's own, taken from its message), the message; no frames of this module.
function syntaxErrorAt(filename, e, source) {
  const err = new SyntaxError(e.message);
  const line = errorLine(e);
  // The stripper's excerpt: the lines up to the error's and a caret under it, up to a blank line.
  const excerpt = String(e.stack).split('\n\n')[0].split('\n').slice(1).join('\n');
  const text = excerpt || source.split('\n')[line - 1] || '';
  err.stack = `${filename}:${line}\n${text}\n\nSyntaxError: ${e.message}`;
  return err;
}

// The code to run for `source`: itself when it is JavaScript, else its types stripped (or
// transformed). Code that is neither throws a SyntaxError: the stripper's, when it parsed
// further than V8 (TypeScript with a mistake after its first type), else V8's own (the source
// is returned as it was for node to report).
function toJavaScript(source, filename) {
  if (!available) return source;
  const jsLine = javaScriptError(source, filename);
  if (jsLine === 0) return source;
  return quietly(() => {
    try {
      return Module.stripTypeScriptTypes(source);
    } catch (e) {
      if (e && e.code === 'ERR_INVALID_TYPESCRIPT_SYNTAX' && errorLine(e) > jsLine) {
        throw syntaxErrorAt(filename, e, source);
      }
      if (!e || e.code !== 'ERR_UNSUPPORTED_TYPESCRIPT_SYNTAX') return source;
    }
    try {
      const out = Module.stripTypeScriptTypes(source, {
        mode: 'transform',
        sourceMap: true,
        sourceUrl: filename,
      });
      process.setSourceMapsEnabled(true);
      return out;
    } catch (e) {
      return source;
    }
  });
}

// Whether converted code must run as an ES module: it has import/export declarations or a
// top-level await, which parse neither as a script nor as a CommonJS function body. Node would
// find that out itself for the file as written, but once a hook gives it the source of a file
// it treats it as the format it asked for.
function needsModule(code, filename) {
  for (const text of [code, `(function () {${code}\n})`]) {
    try {
      new vm.Script(text, { filename });
      return false;
    } catch (e) {
      if (!(e instanceof SyntaxError)) return false;
    }
  }
  return true;
}

// hookMainScript(file): the code file `file` (the one-shot run's script) goes through
// toJavaScript when node loads it, as CommonJS and again as a module (node loads a file with
// import declarations twice: it tries CommonJS first); other module loads pass straight through.
function hookMainScript(file) {
  if (!available || typeof Module.registerHooks !== 'function') return;
  const url = require('url').pathToFileURL(file).href;
  let converted = null; // [source, code, format]: the conversion is made once
  Module.registerHooks({
    load(target, context, nextLoad) {
      const result = nextLoad(target, context);
      if (target !== url || result.source == null) return result;
      const source = String(result.source);
      if (converted === null || converted[0] !== source) {
        try {
          const code = toJavaScript(source, file);
          converted = [source, code, code !== source && needsModule(code, file) ? 'module' : null];
        } catch (e) {
          // TypeScript with a syntax error: reported as node reports a script's, and nothing runs.
          process.stderr.write(`${e.stack}\n`);
          process.exitCode = 1;
          converted = [source, '', null];
        }
      }
      if (converted[1] === source) return result;
      const format = converted[2] || result.format;
      return { ...result, source: converted[1], ...(format ? { format } : {}) };
    },
  });
}

// warm(): load the stripper now (a parked node does, before its ready), so that its first
// TypeScript run does not pay for it.
function warm() {
  if (available) quietly(() => Module.stripTypeScriptTypes('let sbx: number;'));
}

module.exports = { toJavaScript, hookMainScript, warm };
