// The sandbox's host tools for JavaScript in the VM: `await tools.NAME(...args)` calls the function
// the host registered as NAME (`tools={...}` of run() or session()) and resolves with its JSON
// result, or rejects with an Error named "ToolError" carrying the host's message (or the
// sandbox's reason, with `refused` true, when the call never reached the host).
//
// It talks to the agent's host socket (docs/protocol.md, "Host tools and rich outputs"): frames
// of a 12-byte header (u32 payload length, u8 type, u8 flags 0, u16 reserved 0, u32 request id;
// little-endian), LOCAL_CALL (str name, str JSON {"args": [...], "kwargs": {}}) answered by one
// LOCAL_REPLY (u8 status, str body) with the request's id; strings are u32 length + bytes.
// One connection per process (and per worker thread: each has its own copy of this module),
// opened at the first call; several calls may be in flight on it. It is unref'd while no call
// waits, so that it never keeps a finished script alive.
//
// The session driver and the pre-start preload (guest/repl/) define the global `tools` as a
// getter that loads this file at its first use: a node that never calls a tool never reads it.
'use strict';
const net = require('net');

const LOCAL_CALL = 1;
const LOCAL_REPLY = 3;
const STATUS_OK = 0;
const STATUS_ERROR = 1;
const HEADER_SIZE = 12;
const ARGS_MAX = 60 * 1024;
const FRAME_MAX = 4 * 1024 * 1024 + 4 * 1024;
const NAME = /^[A-Za-z_][A-Za-z0-9_]{0,63}$/;

class ToolError extends Error {
  constructor(message, refused = false) {
    super(message);
    this.name = 'ToolError';
    this.refused = refused;
  }
}

let conn = null;

function socketPath() {
  return process.env.EXEC_SANDBOX_HOST_SOCKET || '/run/sbx/host.sock';
}

// Every call still waiting on a connection that ends fails with `reason`.
function fail(c, reason) {
  if (c.closed) return;
  c.closed = true;
  if (conn === c) conn = null;
  c.socket.destroy();
  for (const { reject } of c.pending.values()) {
    reject(new ToolError(`the host socket broke: ${reason}`, true));
  }
  c.pending.clear();
}

function connection() {
  if (conn !== null) return conn;
  const c = {
    socket: net.connect(socketPath()),
    pending: new Map(),
    nextId: 0,
    buffer: Buffer.alloc(0),
    closed: false,
  };
  c.socket.unref();
  c.socket.on('data', (chunk) => {
    c.buffer = c.buffer.length ? Buffer.concat([c.buffer, chunk]) : chunk;
    while (c.buffer.length >= HEADER_SIZE) {
      const length = c.buffer.readUInt32LE(0);
      const bad = c.buffer[4] !== LOCAL_REPLY || c.buffer[5] !== 0 || c.buffer.readUInt16LE(6) !== 0
        || length < 5 || length > FRAME_MAX;
      if (bad) return fail(c, 'malformed frame from the agent');
      if (c.buffer.length < HEADER_SIZE + length) return undefined;
      const id = c.buffer.readUInt32LE(8);
      const payload = c.buffer.subarray(HEADER_SIZE, HEADER_SIZE + length);
      c.buffer = c.buffer.subarray(HEADER_SIZE + length);
      if (payload.readUInt32LE(1) !== length - 5) return fail(c, 'malformed reply from the agent');
      const waiter = c.pending.get(id);
      if (waiter === undefined) continue;
      c.pending.delete(id);
      if (c.pending.size === 0) c.socket.unref();
      const status = payload[0];
      const body = payload.subarray(5).toString('utf8');
      if (status === STATUS_OK) {
        try {
          waiter.resolve(JSON.parse(body));
        } catch (e) {
          waiter.reject(new ToolError(`tools.${waiter.name}: the host's result is not JSON: ${e.message}`));
        }
      } else if (status === STATUS_ERROR) {
        waiter.reject(new ToolError(body));
      } else {
        waiter.reject(new ToolError(`tools.${waiter.name}: refused by the sandbox: ${body}`, true));
      }
    }
    return undefined;
  });
  c.socket.on('error', (err) => {
    fail(c, err.code === 'ENOENT' || err.code === 'ECONNREFUSED'
      ? `cannot reach the host socket ${socketPath()}: ${err.message}` : err.message);
  });
  c.socket.on('close', () => fail(c, 'the agent closed the host socket'));
  conn = c;
  return c;
}

function str(buf) {
  const len = Buffer.alloc(4);
  len.writeUInt32LE(buf.length, 0);
  return [len, buf];
}

async function call(name, ...args) {
  if (typeof name !== 'string' || !NAME.test(name)) {
    throw new TypeError(`invalid tool name ${JSON.stringify(String(name))}: [A-Za-z_][A-Za-z0-9_]*, at most 64 bytes`);
  }
  let text;
  try {
    text = JSON.stringify({ args, kwargs: {} });
  } catch (e) {
    throw new TypeError(`tools.${name}: arguments must be JSON-serialisable: ${e.message}`);
  }
  const argsBuf = Buffer.from(text, 'utf8');
  if (argsBuf.length > ARGS_MAX) {
    throw new TypeError(`tools.${name}: arguments are ${argsBuf.length} bytes of JSON, over the limit of ${ARGS_MAX} bytes`);
  }
  const c = connection();
  c.nextId = (c.nextId % 0xffffffff) + 1;
  const id = c.nextId;
  const payload = Buffer.concat([...str(Buffer.from(name, 'utf8')), ...str(argsBuf)]);
  const header = Buffer.alloc(HEADER_SIZE);
  header.writeUInt32LE(payload.length, 0);
  header[4] = LOCAL_CALL;
  header.writeUInt32LE(id, 8);
  return new Promise((resolve, reject) => {
    c.pending.set(id, { name, resolve, reject });
    c.socket.ref(); // a call in flight keeps the process alive until its reply
    c.socket.write(Buffer.concat([header, payload]));
  });
}

// Names that JavaScript itself asks objects for (await's `then`, JSON.stringify's `toJSON`,
// string conversion, util.inspect) are not tools: a Proxy that answered them with a host call
// would make `await tools` hang or `${tools}` call the host.
const NOT_TOOLS = new Set(['then', 'catch', 'finally', 'toJSON', 'toString', 'valueOf', 'constructor', 'inspect', 'asymmetricMatch', 'nodeType']);
const description = '[exec-sandbox host tools: await tools.NAME(...args) calls the host\'s NAME]';

const tools = new Proxy(Object.create(null), {
  get(target, prop) {
    if (prop === Symbol.for('nodejs.util.inspect.custom')) return () => description;
    if (prop === Symbol.toPrimitive) return () => description;
    if (prop === Symbol.toStringTag) return 'Tools';
    if (typeof prop !== 'string' || prop.startsWith('_') || NOT_TOOLS.has(prop)) return undefined;
    const tool = (...args) => call(prop, ...args);
    Object.defineProperty(tool, 'name', { value: prop });
    return tool;
  },
  has(target, prop) {
    return typeof prop === 'string' && !prop.startsWith('_') && !NOT_TOOLS.has(prop);
  },
  set() { return false; },
});

module.exports = { tools, call, ToolError };
