// Session REPL driver for JavaScript, started by sbx-agent as the sandbox user (see
// guest/src/repl.h). fd 3: one line per request, the directory holding session-code and
// session-env; fd 4: "<status>\n" back once the code has finished. The code runs through node's own
// REPL evaluator in the global context, so const/let/function/class declarations persist between
// requests and top-level await works. The user's stdout/stderr are the real pipes (synchronous on
// Linux), so the output is complete when the status is written.
'use strict';
const fs = require('fs');
const path = require('path');
const repl = require('repl');
const util = require('util');
const { PassThrough, Writable } = require('stream');

const controlOut = 4;
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

async function main() {
  for (;;) {
    const dir = await nextLine();
    let status;
    try {
      applyEnv(path.join(dir, 'session-env'));
      const code = fs.readFileSync(path.join(dir, 'session-code'), 'utf8');
      status = statusOf(await evaluate(code));
    } catch (err) {
      status = statusOf(err);
    }
    fs.writeSync(controlOut, `${status}\n`);
  }
}

main();
