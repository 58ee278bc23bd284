// A small RFC 6455 WebSocket client over node:http's `upgrade`, because node 20 has no global
// WebSocket and the package takes no dependencies. What the API needs and no more: text and
// binary messages, fragmentation, ping/pong, the close handshake, masking of what the client
// sends; no extensions (none are offered, so a server's RSV bits are a protocol error).
// Everything read is bounded: a frame or message over `maxMessageBytes` closes with 1009, and
// a reader that falls behind pauses the socket (TCP backpressure) instead of buffering. Nothing
// waits on the server forever: the handshake has a deadline, and an open connection pings the
// server while it is quiet (a long exec may print nothing for minutes), so a server that hangs
// or vanishes without a FIN fails the connection instead of leaving its reader waiting.

import { createHash, randomBytes } from "node:crypto";
import type { ClientRequest, IncomingMessage } from "node:http";
import type { Duplex } from "node:stream";

import { CommunicationError } from "./errors.ts";

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
const OP_CONTINUATION = 0x0;
const OP_TEXT = 0x1;
const OP_BINARY = 0x2;
const OP_CLOSE = 0x8;
const OP_PING = 0x9;
const OP_PONG = 0xa;
/** Messages, and bytes, queued for a slow reader before the socket is paused. */
const QUEUE_HIGH = 64;
const QUEUE_HIGH_BYTES = 8 * 1024 * 1024;
/** How long close() waits for the server's close frame before dropping the connection. */
const CLOSE_WAIT_MS = 5_000;

export const DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
/** Why the server closes a stream before its end (exec_sandbox.wire): the client read too
 * slowly for its bounded queue, or its token was revoked or expired while the socket was open. */
export const CLOSE_TOO_SLOW = 1013;
export const CLOSE_TOKEN_INVALID = 1008;
/** The same figures as the Python client's: a handshake within 10 s, a ping after 20 s, its
 * pong within 60 s. */
export const DEFAULT_HANDSHAKE_TIMEOUT_MS = 10_000;
export const DEFAULT_PING_INTERVAL_MS = 20_000;
export const DEFAULT_PING_TIMEOUT_MS = 60_000;

export interface WebSocketOptions {
  /** Largest message accepted. */
  maxMessageBytes?: number;
  /** A ping is sent this long after the last pong (0: never). */
  pingIntervalMs?: number;
  /** A ping unanswered this long fails the connection. */
  pingTimeoutMs?: number;
  /** The server's answer to the upgrade request must come within this. */
  handshakeTimeoutMs?: number;
}

export type WebSocketMessage = { type: "text"; data: string } | { type: "binary"; data: Uint8Array };

/** What a handshake needs: a request made but not yet ended (headers still settable). */
export function handshakeHeaders(): { key: string; headers: Record<string, string> } {
  const key = randomBytes(16).toString("base64");
  return {
    key,
    headers: {
      Connection: "Upgrade",
      Upgrade: "websocket",
      "Sec-WebSocket-Version": "13",
      "Sec-WebSocket-Key": key,
    },
  };
}

export function acceptOf(key: string): string {
  return createHash("sha1").update(key + GUID).digest("base64");
}

/** The open connection: receive() messages in order, send() text or bytes, close(). */
export class WebSocket {
  /** The close code the server sent (1005 when it sent none, 1006 for a dropped connection). */
  closeCode: number | null = null;
  closeReason = "";

  readonly #socket: Duplex;
  readonly #maxMessageBytes: number;
  #chunks: Buffer[] = [];
  #buffered = 0;
  #fragments: Buffer[] = [];
  #fragmentsBytes = 0;
  #fragmentOp = 0;
  #queue: WebSocketMessage[] = [];
  #queuedBytes = 0;
  #waiters: Array<{ resolve: (m: WebSocketMessage | null) => void; reject: (e: Error) => void }> = [];
  #error: Error | null = null;
  #ended = false;
  #closeSent = false;
  #closing = false;
  #closed: Promise<void>;
  #markClosed!: () => void;
  readonly #pingIntervalMs: number;
  readonly #pingTimeoutMs: number;
  #pingTimer: ReturnType<typeof setTimeout> | undefined;
  #pongTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(socket: Duplex, head: Buffer, options: WebSocketOptions = {}) {
    this.#socket = socket;
    this.#maxMessageBytes = options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
    this.#pingIntervalMs = options.pingIntervalMs ?? DEFAULT_PING_INTERVAL_MS;
    this.#pingTimeoutMs = options.pingTimeoutMs ?? DEFAULT_PING_TIMEOUT_MS;
    this.#closed = new Promise((resolve) => {
      this.#markClosed = resolve;
    });
    socket.on("data", (chunk: Buffer) => this.#onData(chunk));
    socket.on("error", (err: Error) => this.#fail(new CommunicationError(`WebSocket: ${err.message}`)));
    socket.on("close", () => this.#onSocketClosed());
    this.#schedulePing();
    if (head.length > 0) this.#onData(head);
  }

  /** The next message; null once the server closed the connection normally. A connection that
   * dropped or broke the protocol rejects with CommunicationError. */
  receive(): Promise<WebSocketMessage | null> {
    const message = this.#queue.shift();
    if (message !== undefined) {
      this.#queuedBytes -= message.data.length;
      const low = this.#queue.length < QUEUE_HIGH / 2 && this.#queuedBytes < QUEUE_HIGH_BYTES / 2;
      if (low && this.#socket.isPaused()) this.#socket.resume();
      return Promise.resolve(message);
    }
    if (this.#error !== null) return Promise.reject(this.#error);
    if (this.#ended) return Promise.resolve(null);
    return new Promise((resolve, reject) => this.#waiters.push({ resolve, reject }));
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<WebSocketMessage> {
    for (;;) {
      const message = await this.receive();
      if (message === null) return;
      yield message;
    }
  }

  sendText(text: string): Promise<void> {
    return this.#send(OP_TEXT, Buffer.from(text, "utf8"));
  }

  sendJson(value: unknown): Promise<void> {
    return this.sendText(JSON.stringify(value));
  }

  sendBinary(data: Uint8Array): Promise<void> {
    return this.#send(OP_BINARY, Buffer.from(data.buffer, data.byteOffset, data.byteLength));
  }

  /** Start the close handshake and wait (bounded) for its end; idempotent. */
  async close(code = 1000, reason = ""): Promise<void> {
    // What comes after our close is not for anyone: a paused socket (a reader that stopped)
    // is read again, and its messages dropped, so that the server's close frame gets through.
    this.#closing = true;
    this.#queue = [];
    this.#queuedBytes = 0;
    if (this.#socket.isPaused()) this.#socket.resume();
    if (!this.#closeSent && !this.#socket.destroyed) {
      const body = Buffer.alloc(2 + Buffer.byteLength(reason));
      body.writeUInt16BE(code, 0);
      body.write(reason, 2, "utf8");
      this.#closeSent = true;
      this.#socket.write(frame(OP_CLOSE, body));
    }
    // Both close frames exchanged (or the connection failed): nothing more is owed, drop the
    // TCP connection now rather than wait for a server that keeps it open.
    if (this.#ended) this.#socket.destroy();
    const timer = setTimeout(() => this.#socket.destroy(), CLOSE_WAIT_MS);
    try {
      await this.#closed;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Drop the connection without the handshake (a reader that gave up). */
  destroy(): void {
    this.#socket.destroy();
  }

  /** The next keepalive ping, pingIntervalMs from now. The timers do not keep the process
   * alive: the socket does, while it is open. */
  #schedulePing(): void {
    if (this.#pingIntervalMs <= 0 || this.#ended) return;
    this.#pingTimer = setTimeout(() => {
      this.#pingTimer = undefined;
      if (this.#ended || this.#closeSent || this.#socket.destroyed) return;
      this.#socket.write(frame(OP_PING, Buffer.from("keepalive")));
      this.#pongTimer = setTimeout(() => {
        this.#pongTimer = undefined;
        this.closeCode = 1006;
        this.#fail(
          new CommunicationError(`WebSocket: the server did not answer a ping within ${this.#pingTimeoutMs} ms`),
        );
      }, this.#pingTimeoutMs);
      this.#pongTimer.unref?.();
    }, this.#pingIntervalMs);
    this.#pingTimer.unref?.();
  }

  #stopPinging(): void {
    clearTimeout(this.#pingTimer);
    clearTimeout(this.#pongTimer);
    this.#pingTimer = undefined;
    this.#pongTimer = undefined;
  }

  #send(op: number, payload: Buffer): Promise<void> {
    if (this.#closeSent || this.#socket.destroyed) {
      return Promise.reject(new CommunicationError("WebSocket: the connection is closed"));
    }
    return new Promise((resolve, reject) => {
      this.#socket.write(frame(op, payload), (err: Error | null | undefined) => (err ? reject(new CommunicationError(err.message)) : resolve()));
    });
  }

  #onData(chunk: Buffer): void {
    this.#chunks.push(chunk);
    this.#buffered += chunk.length;
    try {
      this.#parse();
    } catch (err) {
      const [code, message] = err instanceof ProtocolError ? [err.closeCode, err.message] : [1002, String(err)];
      this.#fail(new CommunicationError(`WebSocket: ${message}`), code);
    }
  }

  #parse(): void {
    while (this.#buffered >= 2 && !this.#ended) {
      const head = this.#peek(Math.min(this.#buffered, 14));
      const fin = (head[0] & 0x80) !== 0;
      if ((head[0] & 0x70) !== 0) throw new ProtocolError(1002, "reserved bits set (no extension was agreed)");
      const op = head[0] & 0x0f;
      if ((head[1] & 0x80) !== 0) throw new ProtocolError(1002, "a server frame is masked");
      let length = head[1] & 0x7f;
      let offset = 2;
      if (length === 126) {
        if (head.length < 4) return;
        length = head.readUInt16BE(2);
        offset = 4;
      } else if (length === 127) {
        if (head.length < 10) return;
        const big = head.readBigUInt64BE(2);
        if (big > BigInt(this.#maxMessageBytes)) throw new ProtocolError(1009, `a frame of ${big} bytes`);
        length = Number(big);
        offset = 10;
      }
      if (op >= 0x8) {
        if (!fin || length > 125) throw new ProtocolError(1002, "a fragmented or long control frame");
      } else if (length + this.#fragmentsBytes > this.#maxMessageBytes) {
        throw new ProtocolError(1009, `a message over ${this.#maxMessageBytes} bytes`);
      }
      if (this.#buffered < offset + length) return;
      this.#take(offset);
      this.#onFrame(fin, op, this.#take(length));
    }
  }

  #onFrame(fin: boolean, op: number, payload: Buffer): void {
    switch (op) {
      case OP_PING:
        if (!this.#closeSent) this.#socket.write(frame(OP_PONG, payload));
        return;
      case OP_PONG:
        // An answer to our ping (an unsolicited pong is a heartbeat, and as good).
        if (this.#pongTimer !== undefined) {
          clearTimeout(this.#pongTimer);
          this.#pongTimer = undefined;
          this.#schedulePing();
        }
        return;
      case OP_CLOSE:
        this.#onClose(payload);
        return;
      case OP_TEXT:
      case OP_BINARY:
        if (this.#fragmentOp !== 0) throw new ProtocolError(1002, "a new message inside a fragmented one");
        if (fin) {
          this.#deliver(op, payload);
        } else {
          this.#fragmentOp = op;
          this.#fragments = [payload];
          this.#fragmentsBytes = payload.length;
        }
        return;
      case OP_CONTINUATION:
        if (this.#fragmentOp === 0) throw new ProtocolError(1002, "a continuation without a message");
        this.#fragments.push(payload);
        this.#fragmentsBytes += payload.length;
        if (fin) {
          const whole = Buffer.concat(this.#fragments, this.#fragmentsBytes);
          const messageOp = this.#fragmentOp;
          this.#fragments = [];
          this.#fragmentsBytes = 0;
          this.#fragmentOp = 0;
          this.#deliver(messageOp, whole);
        }
        return;
      default:
        throw new ProtocolError(1002, `unknown opcode ${op}`);
    }
  }

  #deliver(op: number, payload: Buffer): void {
    if (this.#closing) return;
    let message: WebSocketMessage;
    if (op === OP_TEXT) {
      let text: string;
      try {
        text = UTF8.decode(payload);
      } catch {
        throw new ProtocolError(1007, "a text message that is not UTF-8");
      }
      message = { type: "text", data: text };
    } else {
      message = { type: "binary", data: new Uint8Array(payload.buffer, payload.byteOffset, payload.length) };
    }
    const waiter = this.#waiters.shift();
    if (waiter !== undefined) {
      waiter.resolve(message);
      return;
    }
    this.#queue.push(message);
    this.#queuedBytes += message.data.length;
    if (this.#queue.length >= QUEUE_HIGH || this.#queuedBytes >= QUEUE_HIGH_BYTES) this.#socket.pause();
  }

  #onClose(payload: Buffer): void {
    if (payload.length === 1) throw new ProtocolError(1002, "a close frame of one byte");
    this.closeCode = payload.length >= 2 ? payload.readUInt16BE(0) : 1005;
    this.closeReason = payload.length > 2 ? payload.subarray(2).toString("utf8") : "";
    if (this.#closeSent) {
      // The answer to our close: the handshake is over, nothing is left to send or read.
      this.#socket.destroy();
    } else {
      this.#closeSent = true;
      const echo = payload.length >= 2 ? payload.subarray(0, 2) : Buffer.alloc(0);
      this.#socket.end(frame(OP_CLOSE, echo));
    }
    this.#ended = true;
    this.#stopPinging();
    this.#flushWaiters();
  }

  #onSocketClosed(): void {
    this.#stopPinging();
    if (!this.#ended && this.#error === null) {
      this.closeCode = 1006;
      this.#fail(new CommunicationError("WebSocket: the connection dropped without a close frame"));
    }
    this.#ended = true;
    this.#flushWaiters();
    this.#markClosed();
  }

  #fail(error: Error, code?: number): void {
    if (this.#error !== null) return;
    this.#stopPinging();
    this.#error = error;
    if (code !== undefined && !this.#closeSent && !this.#socket.destroyed) {
      const body = Buffer.alloc(2);
      body.writeUInt16BE(code, 0);
      this.#closeSent = true;
      this.#socket.end(frame(OP_CLOSE, body));
    }
    this.#ended = true;
    this.#socket.destroy();
    this.#flushWaiters();
  }

  #flushWaiters(): void {
    if (this.#queue.length > 0) return; // queued messages first; receive() reports the end after
    for (const waiter of this.#waiters.splice(0)) {
      if (this.#error !== null) waiter.reject(this.#error);
      else waiter.resolve(null);
    }
  }

  /** The first n bytes (n <= 14: a frame header), joining only the chunks they span. */
  #peek(n: number): Buffer {
    if (this.#chunks[0].length >= n) return this.#chunks[0].subarray(0, n);
    const parts: Buffer[] = [];
    let size = 0;
    for (const chunk of this.#chunks) {
      if (size >= n) break;
      parts.push(chunk);
      size += chunk.length;
    }
    return Buffer.concat(parts, size).subarray(0, n);
  }

  #take(n: number): Buffer {
    if (n === 0) return Buffer.alloc(0);
    let whole = this.#chunks[0];
    if (whole.length < n) {
      whole = Buffer.concat(this.#chunks, this.#buffered);
      this.#chunks = [whole];
    }
    const out = whole.subarray(0, n);
    if (whole.length === n) this.#chunks.shift();
    else this.#chunks[0] = whole.subarray(n);
    this.#buffered -= n;
    return out;
  }
}

class ProtocolError extends Error {
  readonly closeCode: number;
  constructor(closeCode: number, message: string) {
    super(message);
    this.closeCode = closeCode;
  }
}

const UTF8 = new TextDecoder("utf-8", { fatal: true });

/** One frame of the client: FIN set, masked with a fresh key (RFC 6455 section 5.3). */
export function frame(op: number, payload: Buffer): Buffer {
  const length = payload.length;
  const headLength = length < 126 ? 2 : length < 65536 ? 4 : 10;
  const out = Buffer.alloc(headLength + 4 + length);
  out[0] = 0x80 | op;
  if (length < 126) {
    out[1] = 0x80 | length;
  } else if (length < 65536) {
    out[1] = 0x80 | 126;
    out.writeUInt16BE(length, 2);
  } else {
    out[1] = 0x80 | 127;
    out.writeBigUInt64BE(BigInt(length), 2);
  }
  const mask = randomBytes(4);
  mask.copy(out, headLength);
  const body = headLength + 4;
  for (let i = 0; i < length; i++) out[body + i] = payload[i] ^ mask[i & 3];
  return out;
}

/** Wait for the server's answer to an upgrade request (already sent with handshakeHeaders()):
 * the open WebSocket, or the HTTP answer that refused it (for the caller to turn into an
 * error). */
export function awaitUpgrade(
  request: ClientRequest,
  key: string,
  options: WebSocketOptions = {},
): Promise<{ ws: WebSocket } | { refused: IncomingMessage }> {
  const timeoutMs = options.handshakeTimeoutMs ?? DEFAULT_HANDSHAKE_TIMEOUT_MS;
  return new Promise<{ ws: WebSocket } | { refused: IncomingMessage }>((resolve, reject) => {
    const timer = setTimeout(() => {
      request.destroy();
      reject(new CommunicationError(`WebSocket: no answer to the handshake within ${timeoutMs} ms`));
    }, timeoutMs);
    const settle = <T>(done: (value: T) => void) => (value: T) => {
      clearTimeout(timer);
      done(value);
    };
    request.on("upgrade", (response: IncomingMessage, socket: Duplex, head: Buffer) => {
      clearTimeout(timer);
      const accept = response.headers["sec-websocket-accept"];
      if (response.headers.upgrade?.toLowerCase() !== "websocket" || accept !== acceptOf(key)) {
        socket.destroy();
        reject(new CommunicationError("WebSocket: the server's handshake answer is wrong"));
        return;
      }
      resolve({ ws: new WebSocket(socket, head, options) });
    });
    request.on("response", settle((response: IncomingMessage) => resolve({ refused: response })));
    request.on("error", settle((err: Error) => reject(new CommunicationError(`WebSocket: ${err.message}`))));
    request.end();
  });
}
