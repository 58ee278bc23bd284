// What a pre-started node runs before its script (docs/protocol.md, PRESTART; the python and bash
// bootstraps are in guest/src/bootstrap.c). sbx-agent starts it as
// `node [--snapshot-blob B] -r THIS /run/sbx/main.js`: node loads this file as a preload, while it
// prepares the main script's run, and once this returns node's own entry point runs the script.
// So the script runs exactly as under `node /run/sbx/main.js`: resolution, the ESM check,
// require.main, and the same stack frames down to node's entry point.
//
// Before its ready this pays what the code's run would otherwise pay for the first time in the
// process (V8 compiles lazily, per process): console output formatting and the streams, the entry
// point's path with an empty script of its own, the report hook. Then it writes the ready byte on
// fd 3 (a socket to the agent) and blocks there until the go:
//   "r" ready; "n" ready, but holding generators that it cannot make fresh (no addon): a RESEED
//       kills it instead (guest/src/runner.h, struct sbx_prestarted);
//   go "1" run the script; "2" the same after making its generators fresh (a RESEED came while it
//       waited: it was parked in an L1 template and this is a clone; guest/node/node_reseed.c);
//   go "3"/"4" (the same two) become the session's REPL driver: the driver's path follows, up to
//       a newline; node's entry point then runs the driver as its main script instead, with the
//       one socket on fd 3 as its control in and out (guest/src/repl.h);
//   anything else (EOF: the agent dropped it) exits quietly.
// When the script has ended as a script would (after every 'exit' listener, unless an uncaught
// exception ends the process: node prints it after the 'exit' event, and that run ends the usual
// way, by the process's death), it reports "d" + the exit status byte on fd 3 before node's own
// teardown, which the result need not wait for. Right before the script it defines the global
// `tools` (the host's tools: a getter that loads tools.js, installed beside this file, at its
// first use), as the session driver does.
'use strict';
(function park() {
  const Module = require('module');
  // Node gives its preloads to every worker thread too: a worker must neither touch fd 3 (the
  // process's one, shared) nor anything else here.
  if (!require('worker_threads').isMainThread) {
    delete Module._cache[__filename];
    return;
  }
  const fs = require('fs');
  const path = require('path');

  const byte = Buffer.alloc(1);

  let running = false;
  let uncaught = false;
  const monitor = () => { uncaught = true; };
  process.on('uncaughtExceptionMonitor', monitor);
  const emit = process.emit;
  process.emit = function (event, ...args) {
    const result = Reflect.apply(emit, this, [event, ...args]);
    if (event === 'exit' && running && !uncaught) {
      // The status node exits with: an 'exit' listener may have set process.exitCode.
      const status = process.exitCode === undefined ? args[0] : process.exitCode;
      try {
        fs.writeSync(3, Buffer.from([0x64, Number(status) & 0xff]));
      } catch (e) {
        // the code closed fd 3: the agent waits for the exit instead
      }
    }
    return result;
  };

  // TypeScript in the code file (ts_hook.js: installed beside this file; under guest/runtime/node
  // in the source tree): its types are stripped as node loads it, when it is not JavaScript.
  for (const dir of [__dirname, path.join(__dirname, '..', 'runtime', 'node')]) {
    try {
      const tsHook = require(path.join(dir, 'ts_hook.js'));
      tsHook.hookMainScript(path.resolve(process.argv[1]));
      // The stripper's first load (a WebAssembly module), paid here rather than by the first
      // TypeScript run: under TCG it is most of such a run's time.
      tsHook.warm();
      delete Module._cache[path.join(dir, 'ts_hook.js')];
      break;
    } catch (e) {
      if (e.code !== 'MODULE_NOT_FOUND' || !String(e.message).includes('ts_hook.js')) throw e;
    }
  }

  // First uses, paid before the ready.
  const sink = { write: () => true, once: () => sink, removeListener: () => sink };
  new (require('console').Console)(sink).log('%s %d %o', 'a', 1, { a: [1] });
  process.stdout.write('');
  process.stderr.write('');
  // The entry point's path (resolution, the ESM check, the CommonJS loader) with an empty script
  // of our own, then forgotten; the script's own run sets require.main again. Best effort:
  // without it the run is only slower.
  const prewarm = `/tmp/.sbx-prewarm-${process.pid}.js`;
  try {
    fs.writeFileSync(prewarm, '', { flag: 'wx', mode: 0o600 });
    try {
      Module.runMain(prewarm);
    } finally {
      fs.unlinkSync(prewarm);
      delete Module._cache[prewarm];
    }
  } catch (e) {
    // a full or read-only /tmp
  }
  process.emit('sbx-prewarm');
  Buffer.from([0x64, 0]);

  let reseed = null;
  try {
    const addon = { exports: {} };
    process.dlopen(addon, path.join(__dirname, 'sbx-reseed.node'));
    if (addon.exports.ready()) reseed = addon.exports.reseed;
  } catch (e) {
    // not beside this file (another image, the agent's host tests): "n"
  }

  const readByte = () => {
    for (;;) {
      try {
        return fs.readSync(3, byte, 0, 1, null) === 1 ? byte[0] : -1;
      } catch (e) {
        if (e.code !== 'EAGAIN' && e.code !== 'EINTR') throw e;
      }
    }
  };
  fs.writeSync(3, reseed ? 'r' : 'n');
  const go = readByte();
  if (go < 0x31 || go > 0x34) process.exit(0); // discarded before the go (the agent kills it anyway)
  if (go === 0x32 || go === 0x34) reseed();

  // What the code sees as in a script run: no trace of this preload in node's options (which
  // child_process.fork() also gives its child) or in the module cache.
  const preload = process.execArgv.indexOf('-r');
  if (preload >= 0 && process.execArgv[preload + 1] === __filename) process.execArgv.splice(preload, 2);
  delete Module._cache[__filename];

  if (go >= 0x33) {
    // The session's REPL driver, as if started as `node DRIVER`: none of our hooks, fds 1 and 2 on
    // /dev/null until the first request's FIFOs. Node has no dup2: close, and open takes the
    // lowest free fd.
    process.emit = emit;
    process.removeListener('uncaughtExceptionMonitor', monitor);
    for (const fd of [1, 2]) {
      fs.closeSync(fd);
      if (fs.openSync('/dev/null', 'w') !== fd) process.exit(70);
    }
    let driver = '';
    for (let c = readByte(); c !== 0x0a; c = readByte()) {
      if (c < 0) process.exit(0);
      driver += String.fromCharCode(c);
    }
    process.argv[1] = driver;
    process[Symbol.for('sbx.control-out')] = 3;
    // Node's entry point calls Module.runMain next, with the script's path read before this
    // preload ran (node 20; node 18 reads argv[1] again): once, it runs the driver instead.
    const runMain = Module.runMain;
    Module.runMain = function () {
      Module.runMain = runMain;
      return Reflect.apply(runMain, this, [driver]);
    };
    return;
  }
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
  running = true;
})();
