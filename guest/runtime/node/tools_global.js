// The global `tools` (the host's tools, tools.js beside this file) as a getter that loads
// tools.js at its first use, so that a node that never calls a tool never pays for it. The
// session driver and the pre-start preload require this file; a one-shot node started without
// that preload gets it with `-r` (guest/src/runner.c). Assigning `tools` replaces it, as with
// any global.
'use strict';
const path = require('path');

const own = { writable: true, configurable: true, enumerable: false };

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
