// Background processes and terminals of a session (docs/server.md: REST for control, a
// WebSocket to read). A Process is only a pid and the session's path: it holds no output.
// Each loop over `stdout` or `stderr` attaches anew and gets what the guest still holds from
// the start, so any number of readers, at any time, see the same bytes (as in Python).

import { CommunicationError, errorFromBody, InputValidationError } from "./errors.ts";
import type { Transport } from "./transport.ts";
import type { ProcessInfo } from "./types.ts";
import { closedError } from "./streaming.ts";
import { CLOSE_TOKEN_INVALID, type WebSocket } from "./websocket.ts";
import { bytesFromWire, object } from "./wire.ts";

type Stream = "stdout" | "stderr";
const STDIN_CHUNK = 4 * 1024 * 1024;

interface ProcessMessage {
  type?: unknown;
  data?: unknown;
  exit_code?: unknown;
  error?: unknown;
}

function parse(data: string): ProcessMessage {
  try {
    return object<ProcessMessage>(JSON.parse(data), "process message");
  } catch (err) {
    if (err instanceof CommunicationError) throw err;
    throw new CommunicationError("a process message that is not JSON");
  }
}

function toBytes(data: string | Uint8Array): Uint8Array {
  return typeof data === "string" ? new TextEncoder().encode(data) : data;
}

export class Process {
  readonly pid: number;
  /** The exit status once known (from wait(), info() or the end of a stream); null before. */
  exitCode: number | null = null;
  readonly #transport: Transport;
  readonly #path: string;

  constructor(transport: Transport, sessionPath: string, pid: number) {
    if (!Number.isSafeInteger(pid) || pid <= 0) throw new CommunicationError(`not a pid: ${String(pid)}`);
    this.#transport = transport;
    this.pid = pid;
    this.#path = `${sessionPath}/processes/${pid}`;
  }

  /** Its output from the start of what the guest holds, as it comes, until it exits. */
  get stdout(): AsyncIterable<Uint8Array> {
    return { [Symbol.asyncIterator]: () => this.#read("stdout") };
  }

  get stderr(): AsyncIterable<Uint8Array> {
    return { [Symbol.asyncIterator]: () => this.#read("stderr") };
  }

  async info(): Promise<ProcessInfo> {
    return this.#note(await this.#transport.json<ProcessInfo>("GET", this.#path));
  }

  /** Its exit status, waiting for it to end (at most timeoutSeconds when given: then a
   * TimeoutError if it still runs; the process goes on). */
  async wait(timeoutSeconds?: number): Promise<number> {
    if (timeoutSeconds !== undefined && !(timeoutSeconds >= 0)) {
      throw new InputValidationError("timeoutSeconds is a number of seconds >= 0");
    }
    // Without a timeout the server holds the request until the process ends.
    const query = timeoutSeconds === undefined ? undefined : { timeout: timeoutSeconds };
    const info = this.#note(await this.#transport.json<ProcessInfo>("POST", `${this.#path}/wait`, { query }));
    if (info.running || info.exit_code === null) {
      throw new TimeoutError(`process ${this.pid} still runs after ${timeoutSeconds} s`);
    }
    return info.exit_code;
  }

  /** Bytes to its stdin (a string as UTF-8). */
  async writeStdin(data: string | Uint8Array): Promise<void> {
    const bytes = toBytes(data);
    // In pieces the server takes in one request (it refuses bodies over 8 MiB).
    for (let at = 0; at < bytes.length; at += STDIN_CHUNK) {
      await this.#transport.json("POST", `${this.#path}/stdin`, { body: bytes.subarray(at, at + STDIN_CHUNK) });
    }
  }

  /** End of input: the program reads EOF. */
  async closeStdin(): Promise<void> {
    await this.#transport.json("POST", `${this.#path}/stdin`, { body: new Uint8Array(0), query: { close: true } });
  }

  /** Send a signal (SIGTERM by default). */
  async kill(signal = 15): Promise<void> {
    if (!Number.isInteger(signal) || signal < 1 || signal > 64) {
      throw new InputValidationError(`not a signal number: ${signal}`);
    }
    await this.#transport.json("POST", `${this.#path}/kill`, { json: { signal } });
  }

  #note(info: ProcessInfo): ProcessInfo {
    object(info, "process info");
    if (!info.running) this.exitCode = info.exit_code;
    return info;
  }

  async *#read(stream: Stream): AsyncGenerator<Uint8Array> {
    const ws = await this.#transport.websocket(this.#path);
    try {
      for (;;) {
        const message = await ws.receive();
        // The server ends a process stream with its exit message; a close before it is not an end.
        if (message === null) throw closedError(ws, `process ${this.pid}: the stream ended before its exit`);
        if (message.type !== "text") throw new CommunicationError("a binary message from a process stream");
        const parsed = parse(message.data);
        if (parsed.type === stream) {
          yield bytesFromWire(parsed.data);
        } else if (parsed.type === "exit") {
          if (typeof parsed.exit_code === "number") this.exitCode = parsed.exit_code;
          return;
        } else if (parsed.type === "error") {
          throw errorFromBody(parsed);
        }
      }
    } finally {
      await ws.close();
    }
  }
}

export class TimeoutError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "TimeoutError";
  }
}

/** A shell on a pseudo-terminal (`session.terminal()`): bytes both ways, resize(), and one
 * final exit status. Output is read once, in order, by `for await` or read(); close() hangs
 * up (the shell gets SIGHUP). */
export class Terminal {
  cols: number;
  rows: number;
  exitCode: number | null = null;
  readonly #ws: WebSocket;

  constructor(ws: WebSocket, cols: number, rows: number) {
    this.#ws = ws;
    this.cols = cols;
    this.rows = rows;
  }

  /** Keystrokes (a string as UTF-8): "\x03" is Ctrl-C, "\x04" Ctrl-D, "\r" Enter. */
  async write(data: string | Uint8Array): Promise<void> {
    await this.#ws.sendBinary(toBytes(data));
  }

  async resize(cols: number, rows: number): Promise<void> {
    await this.#ws.sendJson({ type: "resize", cols, rows });
    this.cols = cols;
    this.rows = rows;
  }

  /** The next output; null once the shell has exited (exitCode then set). */
  async read(): Promise<Uint8Array | null> {
    for (;;) {
      const message = await this.#ws.receive();
      if (message === null) {
        if (this.#ws.closeCode === CLOSE_TOKEN_INVALID) throw closedError(this.#ws, "terminal");
        return null;
      }
      if (message.type === "binary") return message.data;
      const parsed = parse(message.data);
      if (parsed.type === "exit") {
        if (typeof parsed.exit_code === "number") this.exitCode = parsed.exit_code;
      } else if (parsed.type === "error") {
        throw errorFromBody(parsed);
      }
    }
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Uint8Array> {
    for (;;) {
      const chunk = await this.read();
      if (chunk === null) return;
      yield chunk;
    }
  }

  /** Read (and drop) output until the shell exits; its exit status. */
  async wait(): Promise<number | null> {
    while ((await this.read()) !== null) {
      // output nobody asked for
    }
    return this.exitCode;
  }

  async close(): Promise<void> {
    await this.#ws.close();
  }
}
