// Session REPL driver for JavaScript, started by sbx-agent as the sandbox user, or a pre-started
// node that became it (see guest/src/repl.h). fd 3: one line per request,
// "<seq> <token> <nonce> <dir>" (<dir> holds session-code and session-env, <dir>/repl/<token>.out
// and .err are the request's output FIFOs); fd 4: "<seq> <nonce> <status>\n" back once the code
// has finished and fds 1 and 2 are /dev/null again. A worker thread the code left running can
// write on fd 4 while this driver holds no FIFO (before it installs a request's, after it
// releases them); the nonce, kept in this module's variables, which no worker can read, is what
// keeps its lines from completing a request. The code runs through node's own
// REPL evaluator in the global context, so const/let/function/class declarations persist between
// requests and top-level await works. The user's stdout/stderr are the real pipes; node queues
// writes to a full pipe, so the status waits until those queues are empty.
'use strict';
const fs = require('fs');
const path = require('path');
const repl = require('repl');
const util = require('util');
const { PassThrough, Writable } = require('stream');

// fd 4, or fd 3 too when a pre-started node became this driver (guest/src/bootstrap.c): it
// leaves the fd here, taken off at once so that the session's code does not see it.
// `tools`, the host's tools, loaded at its first use (tools_global.js: installed beside this
// file; under guest/runtime/node in the source tree, which the agent's host tests run from).
for (const dir of [__dirname, path.join(__dirname, '..', 'runtime', 'node')]) {
  try {
    require(path.join(dir, 'tools_global.js'));
    break;
  } catch (e) {
    if (e.code !== 'MODULE_NOT_FOUND' || !String(e.message).includes('tools_global.js')) throw e;
  }
}

// TypeScript in a cell: its types stripped when it is not JavaScript (ts_hook.js, beside
// tools_global.js).
let toJavaScript = (code) => code;
for (const dir of [__dirname, path.join(__dirname, '..', 'runtime', 'node')]) {
  try {
    ({ toJavaScript } = require(path.join(dir, 'ts_hook.js')));
    break;
  } catch (e) {
    if (e.code !== 'MODULE_NOT_FOUND' || !String(e.message).includes('ts_hook.js')) throw e;
  }
}

const controlOutKey = Symbol.for('sbx.control-out');
const controlOut = process[controlOutKey] === 3 ? 3 : 4;
delete process[controlOutKey];
const realExit = process.exit.bind(process);

// The REPL machinery without its terminal: no prompt, nothing echoed.
const server = repl.start({
  input: new PassThrough(),
  output: new Writable({ write(chunk, encoding, done) { done(); } }),
  prompt: '',
  terminal: false,
  useGlobal: true,
  ignoreUndefined: true,
});

// process.exit() in user code ends the request with that status, not the REPL.
class ExitRequest extends Error {
  constructor(code) { super(`process.exit(${code})`); this.exitCode = code; }
}
process.exit = (code) => { throw new ExitRequest(code === undefined ? 0 : Number(code) | 0); };
// SIGINT (the output limit) must not kill the REPL with its state.
process.on('SIGINT', () => {});

let settle = null;
// The evaluator hands errors of the user's code to the REPL's domain rather than to the callback.
server._domain.on('error', (err) => { if (settle) settle(err); });

function evaluate(code) {
  return new Promise((resolve) => {
    settle = (err) => { settle = null; resolve(err); };
    server.eval(code, server.context, 'session', (err) => { if (settle) settle(err); });
  });
}

function statusOf(err) {
  if (!err) return 0;
  if (err instanceof ExitRequest) return err.exitCode & 0xff;
  const shown = err.name === 'Recoverable' && err.err ? err.err : err;
  // The user's frames only: those of the REPL machinery are noise.
  const text = shown && shown.stack
    ? shown.stack.split('\n').filter((l) => !/^\s+at .*\(node:/.test(l)).join('\n')
    : util.inspect(shown);
  try {
    process.stderr.write(`${text}\n`);
  } catch (e) { /* stderr closed by the user: the status still goes out */ }
  return 1;
}

// Requests arrive as lines on fd 3, read asynchronously so that the user's timers and promises
// keep running between requests.
const lines = [];
let waiter = null;
let pending = '';
const control = fs.createReadStream(null, { fd: 3 });
control.on('data', (chunk) => {
  pending += chunk.toString();
  let i;
  while ((i = pending.indexOf('\n')) >= 0) {
    lines.push(pending.slice(0, i));
    pending = pending.slice(i + 1);
  }
  if (waiter && lines.length) { const w = waiter; waiter = null; w(lines.shift()); }
});
control.on('end', () => realExit(0));

function nextLine() {
  return lines.length ? Promise.resolve(lines.shift()) : new Promise((resolve) => { waiter = resolve; });
}

function applyEnv(file) {
  for (const record of fs.readFileSync(file).toString().split('\0')) {
    const eq = record.indexOf('=');
    if (eq > 0) process.env[record.slice(0, eq)] = record.slice(eq + 1);
  }
}

async function flushed(stream) {
  while (stream.writableLength > 0 && !stream.destroyed) {
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
}

// Node has no dup2: closing fd N and opening a file at once gives N (the lowest free fd). Only
// the driver's synchronous code runs in between; a libuv worker opening a file in that instant
// could take N: then the REPL cannot go on, and it exits (the agent reports its death).
function install(fd, file) {
  fs.closeSync(fd);
  const got = fs.openSync(file, fs.constants.O_WRONLY);
  if (got !== fd) realExit(70);
}

async function main() {
  for (;;) {
    const line = await nextLine();
    const [seq, token, nonce] = line.split(' ', 3);
    const dir = line.slice(seq.length + token.length + nonce.length + 3);
    const fifo = path.join(dir, 'repl', token);
    if (!fs.existsSync(`${fifo}.out`)) continue; // the request is already over
    install(1, `${fifo}.out`);
    install(2, `${fifo}.err`);
    let status;
    try {
      applyEnv(path.join(dir, 'session-env'));
      const code = toJavaScript(fs.readFileSync(path.join(dir, 'session-code'), 'utf8'), 'session');
      status = statusOf(await evaluate(code));
    } catch (err) {
      status = statusOf(err);
    }
    // A pipe that was full leaves writes queued in node: report only once they reached it, so
    // that the result holds all of the output and none of it leaks into the next request.
    await flushed(process.stdout);
    await flushed(process.stderr);
    // The agent believes the report only once no fd of this process is on the FIFOs: copies
    // the code opened (/proc/self/fd/1) write to /dev/null from now on.
    for (const name of fs.readdirSync('/proc/self/fd')) {
      let target;
      try { target = fs.readlinkSync(`/proc/self/fd/${name}`); } catch (e) { continue; }
      if (target === `${fifo}.out` || target === `${fifo}.err`) install(Number(name), '/dev/null');
    }
    fs.writeSync(controlOut, `\n${seq} ${nonce} ${status}\n`);
  }
}

main();
