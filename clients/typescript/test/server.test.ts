// The client against a real `sbx serve` that this file starts (on a Unix socket and on
// 127.0.0.1 with a token made by `sbx token create` in a temporary state directory), running
// code in real VMs. $SBX names the sbx to run (default: the repository's .venv/bin/sbx).
import assert from "node:assert/strict";
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import {
  FileNotFoundError,
  InputValidationError,
  PackageNotAllowedError,
  PermanentError,
  Scheduler,
  type Session,
  SessionClosedError,
  TimeoutError,
} from "../src/index.ts";

const SBX = process.env.SBX ?? fileURLToPath(new URL("../../../.venv/bin/sbx", import.meta.url));
const START_SECONDS = 120;

interface Server {
  child: ChildProcess;
  socketPath: string;
  url: string;
  token: string;
  otherToken: string;
  dir: string;
}

/** Every process descended from pid (its QEMUs and their helpers), from /proc. */
function descendants(pid: number): number[] {
  const parent = new Map<number, number>();
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, "utf8");
      parent.set(Number(name), Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]));
    } catch {
      // gone meanwhile
    }
  }
  const found: number[] = [];
  const todo = [pid];
  while (todo.length > 0) {
    const p = todo.pop() as number;
    for (const [child, ppid] of parent) {
      if (ppid === p) {
        found.push(child);
        todo.push(child);
      }
    }
  }
  return found;
}

async function startServer(): Promise<Server> {
  const dir = mkdtempSync(join(tmpdir(), "sbx-ts-"));
  // Its state (tokens) and data (volumes) in the test's own directory.
  const env = { ...process.env, EXEC_SANDBOX_STATE_DIR: join(dir, "state"), EXEC_SANDBOX_DATA_DIR: join(dir, "data") };
  const token = execFileSync(SBX, ["token", "create", "--name", "ts-client"], { env, encoding: "utf8" }).trim();
  const otherToken = execFileSync(SBX, ["token", "create", "--name", "ts-other"], { env, encoding: "utf8" }).trim();
  const socketPath = join(dir, "sbx.sock");
  const child = spawn(
    SBX,
    ["serve", "--socket", socketPath, "--port", "0", "--warm-pool", "0", "--max-vms", "2", "--on-shutdown", "close"],
    { env, stdio: ["ignore", "pipe", "inherit"] },
  );
  const url = await new Promise<string>((resolve, reject) => {
    let seen = "";
    let socketUp = false;
    let tcp = "";
    const timer = setTimeout(() => reject(new Error(`sbx serve did not listen within ${START_SECONDS} s`)), START_SECONDS * 1000);
    child.stdout?.setEncoding("utf8");
    child.stdout?.on("data", (text: string) => {
      seen += text;
      socketUp ||= seen.includes(`listening on unix:${socketPath}`);
      tcp ||= /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(seen)?.[1] ?? "";
      if (socketUp && tcp !== "") {
        clearTimeout(timer);
        resolve(tcp);
      }
    });
    child.on("exit", (code: number | null) => {
      clearTimeout(timer);
      reject(new Error(`sbx serve exited (${code}) before listening`));
    });
  });
  return { child, socketPath, url, token, otherToken, dir };
}

/** SIGTERM, and check that the server took everything it started with it. */
async function stopServer(server: Server): Promise<void> {
  const children = server.child.pid === undefined ? [] : descendants(server.child.pid);
  const exited = new Promise((resolve) => server.child.once("exit", resolve));
  if (server.child.exitCode === null) server.child.kill("SIGTERM");
  const timer = setTimeout(() => server.child.kill("SIGKILL"), 30_000);
  await exited;
  clearTimeout(timer);
  const deadline = Date.now() + 10_000;
  let left = children.filter((pid) => existsSync(`/proc/${pid}`));
  while (left.length > 0 && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 100));
    left = left.filter((pid) => existsSync(`/proc/${pid}`));
  }
  rmSync(server.dir, { recursive: true, force: true });
  assert.deepEqual(left, [], "processes of the server outlived it");
  assert.ok(!existsSync(server.socketPath), "the server left its socket behind");
}

// Each test bounded: a step that waits for output that never comes fails instead of hanging.
const TEST = { timeout: 120_000 };

describe("against sbx serve", () => {
  let server: Server;
  let local: Scheduler;
  let remote: Scheduler;

  before(async () => {
    server = await startServer();
    local = new Scheduler({ socketPath: server.socketPath });
    remote = new Scheduler({ url: server.url, token: server.token });
  });
  after(async () => {
    local?.close();
    remote?.close();
    if (server !== undefined) await stopServer(server);
  });

  test("the Unix socket needs no token; TCP knows the token's name", TEST, async () => {
    assert.equal((await local.health()).status, "ok");
    assert.equal((await local.info()).principal, "local");
    const info = await remote.info();
    assert.equal(info.principal, "ts-client");
    assert.ok(info.scopes.includes("run"));
  });

  test("an unknown token is unauthorized, on REST and on a WebSocket", TEST, async () => {
    const stranger = new Scheduler({ url: server.url, token: "not-a-token" });
    try {
      assert.equal((await stranger.health()).status, "ok"); // health alone needs none
      await assert.rejects(stranger.info(), (err: PermanentError) => err instanceof PermanentError && err.code === "unauthorized" && err.status === 401);
      await assert.rejects(stranger.run("print(1)", { onStdout: () => {} }), (err: PermanentError) => err.code === "unauthorized");
    } finally {
      stranger.close();
    }
  });

  test("bad input is refused with its code before any VM starts", TEST, async () => {
    await assert.rejects(local.run("print(1)", { packages: ["numpy"] }), (err: PackageNotAllowedError) => err instanceof PackageNotAllowedError && err.code === "package_not_allowed" && err.status === 400);
    await assert.rejects(local.run("print(1)", { noSuchOption: 1 } as never), (err: InputValidationError) => err instanceof InputValidationError && err.code === "input_validation");
  });

  test("run returns the result over the Unix socket", TEST, async () => {
    const result = await local.run("print(6 * 7)\nimport sys; print('warn', file=sys.stderr); sys.exit(3)");
    assert.equal(result.stdout, "42\n");
    assert.equal(result.stderr, "warn\n");
    assert.equal(result.exit_code, 3);
    assert.equal(typeof result.timing.total_ms, "number");
  });

  test("run streams output to the callbacks over TCP as the code writes it", TEST, async () => {
    const out: string[] = [];
    const err: string[] = [];
    const result = await remote.run(
      "console.log('a'); console.error('e'); console.log('b');",
      { language: "javascript", onStdout: (t) => out.push(t), onStderr: (t) => err.push(t) },
    );
    assert.equal(result.exit_code, 0);
    assert.equal(out.join(""), "a\nb\n");
    assert.equal(err.join(""), "e\n");
  });

  test("aborting a streamed run rejects with the signal's reason and cancels it on the server", TEST, async () => {
    // Two runs that would hold both of the server's VM slots for minutes, aborted once they
    // started: a third run finds room only if the server cancelled them.
    for (let i = 0; i < 2; i++) {
      const controller = new AbortController();
      await assert.rejects(
        local.run("import time\nprint('started', flush=True)\ntime.sleep(300)", {
          signal: controller.signal,
          timeoutSeconds: 300,
          onStdout: () => controller.abort(),
        }),
        (err: Error) => err.name === "AbortError",
      );
    }
    assert.equal((await local.run("print('room')", { timeoutSeconds: 60 })).stdout, "room\n");
    const gone = new AbortController();
    gone.abort();
    await assert.rejects(local.run("print(1)", { signal: gone.signal }), (err: Error) => err.name === "AbortError");
  });

  test("a session keeps state, moves files, runs a process and a terminal, then closes", TEST, async () => {
    const session = await remote.session({ language: "python" });
    try {
      await session.exec("x = 41");
      const streamed: string[] = [];
      const r = await session.exec("print(x + 1)", { onStdout: (t) => streamed.push(t) });
      assert.equal(r.stdout, "42\n");
      assert.equal(streamed.join(""), "42\n");
      const failed = await session.exec("raise ValueError('boom')");
      assert.notEqual(failed.exit_code, 0);
      assert.match(failed.stderr, /ValueError: boom/);
      assert.equal((await session.exec("print(x)")).stdout, "41\n"); // an exception keeps state
      const refused = (err: InputValidationError) => err instanceof InputValidationError && err.code === "input_validation";
      await assert.rejects(session.exec("print(x)", { timeoutSeconds: -5 }), refused);
      await assert.rejects(session.exec("print(x)", { timeoutSeconds: -5, onStdout: () => {} }), refused);

      assert.deepEqual(await session.networkLog(), []); // no network asked for, none used
      await assert.rejects(session.install(["numpy>=1.0"]), (err: PackageNotAllowedError) => err instanceof PackageNotAllowedError && err.code === "package_not_allowed");
      const refreshed = await session.refresh();
      assert.equal(refreshed.exec_count, session.execCount);
      assert.equal(refreshed.owner, "ts-client");
      assert.equal(refreshed.closed, false);

      const payload = new Uint8Array(256).map((_, i) => i);
      await session.writeFile("bin/data.bin", payload);
      await session.writeFile("hello.txt", "hi there\n");
      assert.deepEqual(await session.readFile("bin/data.bin"), payload);
      assert.equal(new TextDecoder().decode(await session.readFile("hello.txt")), "hi there\n");
      const files = await session.listFiles();
      const hello = files.find((f) => f.name === "hello.txt");
      assert.deepEqual(hello, { name: "hello.txt", is_dir: false, size: 9 });
      assert.ok(files.some((f) => f.name === "bin" && f.is_dir));
      await assert.rejects(session.readFile("no/such.txt"), (err: FileNotFoundError) => err instanceof FileNotFoundError && err.code === "file_not_found" && err.status === 404);

      const proc = await session.spawn(["python3", "-c", "import sys; print(sys.stdin.read().upper(), end='')"]);
      await proc.writeStdin("shout\n");
      await proc.closeStdin();
      assert.equal(await proc.wait(60), 0);
      const chunks: Uint8Array[] = [];
      for await (const chunk of proc.stdout) chunks.push(chunk);
      assert.equal(Buffer.concat(chunks).toString(), "SHOUT\n");
      assert.ok((await session.processes()).some((p) => p.pid === proc.pid));

      const ticker = await session.spawn(["python3", "-u", "-c", "import time\nfor i in range(600): print(i); time.sleep(0.05)"]);
      let live = "";
      for await (const chunk of ticker.stdout) {
        live += Buffer.from(chunk).toString();
        if (live.includes("3\n")) break; // output as it comes, long before the end
      }
      assert.match(live, /^0\n1\n2\n3\n/);
      assert.equal((await ticker.info()).running, true);
      await ticker.kill();
      assert.equal(await ticker.wait(30), 143);

      const sleeper = await session.spawn("sleep 60");
      await assert.rejects(sleeper.wait(0.2), TimeoutError);
      await sleeper.kill(9);
      assert.equal(await sleeper.wait(30), 137);

      const terminal = await session.terminal({ cols: 100, rows: 30 });
      await terminal.write("stty size\r");
      let screen = "";
      while (!/[\r\n]30 100\r\n/.test(screen)) {
        const chunk = await terminal.read();
        assert.ok(chunk !== null, `the shell ended early: ${screen}`);
        screen += Buffer.from(chunk).toString();
      }
      await terminal.resize(120, 40);
      await terminal.write("stty size; echo tty-$((40 + 2)); exit 5\r");
      screen = "";
      for await (const chunk of terminal) screen += Buffer.from(chunk).toString();
      assert.match(screen, /[\r\n]40 120\r\n/);
      assert.match(screen, /tty-42/);
      assert.equal(terminal.exitCode, 5);
    } finally {
      await session.close();
    }
    assert.ok(session.closed);
    await assert.rejects(session.exec("print(1)"), SessionClosedError);
    await session.close(); // idempotent
  });

  test("a session is its owner's until shared with another token by name", TEST, async () => {
    const other = new Scheduler({ url: server.url, token: server.otherToken });
    const session = await remote.session();
    try {
      await session.exec("secret = 'mine'");
      await assert.rejects(other.getSession(session.sessionId), (err: SessionClosedError) => err.code === "not_found");
      assert.ok(!(await other.sessions()).some((s) => s.id === session.sessionId));
      assert.ok((await local.sessions()).some((s) => s.id === session.sessionId)); // the socket is admin

      const info = await session.share(["ts-other"]);
      assert.deepEqual(info.shared_with, ["ts-other"]);
      const borrowed = await other.getSession(session.sessionId);
      assert.equal(borrowed.info.owner, "ts-client");
      assert.equal((await borrowed.exec("print(secret)")).stdout, "mine\n");
      await assert.rejects(borrowed.share([]), (err: PermanentError) => err.code === "forbidden");
    } finally {
      await session.close();
      other.close();
    }
  });

  test("fork copies a live session; pause and resume bring one back with its state", TEST, async () => {
    const session = await local.session({ language: "python" });
    let fork: Session | undefined;
    let resumed: Session | undefined;
    try {
      await session.exec("import os; x = 7; os.chdir('/tmp')");
      fork = await session.fork();
      assert.notEqual(fork.sessionId, session.sessionId);
      await fork.exec("x += 1");
      assert.equal((await fork.exec("print(x, os.getcwd())")).stdout, "8 /tmp\n");
      assert.equal((await session.exec("print(x)")).stdout, "7\n"); // the copy is separate

      const snapshot = await session.pause();
      assert.ok(session.closed);
      assert.ok((await local.snapshots()).some((s) => s.id === snapshot.id));
      resumed = await local.resume(snapshot.id);
      assert.equal((await resumed.exec("print(x, os.getcwd())")).stdout, "7 /tmp\n");
      await local.deleteSnapshot(snapshot.id);
      assert.ok(!(await local.snapshots()).some((s) => s.id === snapshot.id));
      await assert.rejects(local.resume(snapshot.id), (err: SessionClosedError) => err.code === "not_found");
    } finally {
      await fork?.close();
      await resumed?.close();
      await session.close();
    }
  });

  test("templates: a run token may list but not build; a bad build is refused before it starts", TEST, async () => {
    assert.ok(Array.isArray(await remote.templates()));
    await assert.rejects(remote.buildTemplate("ts-client-tpl", { steps: [{ run: "true" }] }), (err: PermanentError) => err.code === "forbidden");
    await assert.rejects(local.buildTemplate("Not A Name!", { steps: [{ run: "true" }] }), (err: InputValidationError) => err instanceof InputValidationError && err.status === 400);
    await assert.rejects(local.deleteTemplate("ts-client-none"), (err: PermanentError) => err.status === 404);
  });

  test("volumes are made and removed with the admin scope; a run token may only list", TEST, async () => {
    const volume = await local.volume("ts-client-vol", { sizeMb: 16 });
    assert.equal(volume.name, "ts-client-vol");
    assert.equal(volume.size_mb, 16);
    try {
      assert.ok((await remote.volumes()).some((v) => v.name === "ts-client-vol"));
      await assert.rejects(remote.volume("ts-client-other"), (err: PermanentError) => err.code === "forbidden" && err.status === 403);
      await assert.rejects(remote.deleteVolume("ts-client-vol"), (err: PermanentError) => err.code === "forbidden");
    } finally {
      await local.deleteVolume("ts-client-vol");
    }
    assert.ok(!(await local.volumes()).some((v) => v.name === "ts-client-vol"));
  });

  test("a token revoked while its process stream is open: the reader rejects as unauthorized", TEST, async () => {
    const env = { ...process.env, EXEC_SANDBOX_STATE_DIR: join(server.dir, "state"), EXEC_SANDBOX_DATA_DIR: join(server.dir, "data") };
    const doomed = execFileSync(SBX, ["token", "create", "--name", "ts-doomed"], { env, encoding: "utf8" }).trim();
    const client = new Scheduler({ url: server.url, token: doomed });
    const session = await client.session({ language: "python" });
    try {
      const proc = await session.spawn(["sh", "-c", "echo started; sleep 60"]);
      const reader = proc.stdout[Symbol.asyncIterator]();
      assert.equal(Buffer.from((await reader.next()).value as Uint8Array).toString(), "started\n");
      execFileSync(SBX, ["token", "revoke", "ts-doomed"], { env });
      await assert.rejects(reader.next(), (err: PermanentError) => err instanceof PermanentError && err.code === "unauthorized");
    } finally {
      await (await local.getSession(session.sessionId)).close(); // the admin socket: the token is gone
      client.close();
    }
  });
});
