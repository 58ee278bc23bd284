// The global `tools` (the host's tools, tools.js beside this file) as a getter that loads
// tools.js at its first use, so that a node that never calls a tool never pays for it. The
// session driver and the pre-start preload require this file; a one-shot node started without
// that preload gets it with `-r` (guest/src/runner.c), and then also the TypeScript hook on its
// code file. Assigning `tools` replaces it, as with
// any global.
'use strict';
const path = require('path');

const own = { writable: true, configurable: true, enumerable: false };

// Given with -r (a cold one-shot run): off process.execArgv, as the pre-start preload takes
// itself off, so that the code sees a script run's flags and its child processes do not load it.
const preload = process.execArgv.indexOf('-r');
if (preload >= 0 && process.execArgv[preload + 1] === __filename) {
  process.execArgv.splice(preload, 2);
  // That run's script is the user's code file: TypeScript in it is stripped as node loads it
  // (ts_hook.js; the pre-started node's preload does the same).
  require(path.join(__dirname, 'ts_hook.js')).hookMainScript(path.resolve(process.argv[1]));
}

Object.defineProperty(globalThis, 'tools', {
  configurable: true,
  enumerable: false,
  get() {
    const value = require(path.join(__dirname, 'tools.js')).tools;
    Object.defineProperty(globalThis, 'tools', { value, ...own });
    return value;
  },
  set(value) {
    Object.defineProperty(globalThis, 'tools', { value, ...own });
  },
});
