// A session on the server (`scheduler.session()`): a live VM with a persistent REPL, reached
// by its id. The object holds the id and the last SessionInfo the server sent; the server
// serialises the calls of one session, so several may be in flight.

import { InputValidationError, SessionClosedError } from "./errors.ts";
import { Process, Terminal } from "./process.ts";
import { streamExec } from "./streaming.ts";
import type { Transport } from "./transport.ts";
import type {
  ExecOptions,
  ExecutionResult,
  FileInfo,
  NetworkConnection,
  PackagesReport,
  ProcessInfo,
  SessionInfo,
  SessionSnapshot,
} from "./types.ts";
import { array, object, resultFromWire } from "./wire.ts";

export class Session {
  /** The API's `session_id` (a SessionInfo's `id` on the wire). */
  readonly sessionId: string;
  /** What the server said of the session at its last answer (refresh with refresh()). */
  info: SessionInfo;
  readonly #transport: Transport;
  readonly #path: string;
  #closed = false;

  constructor(transport: Transport, info: SessionInfo) {
    object(info, "session");
    if (typeof info.id !== "string" || !/^[A-Za-z0-9_.-]{1,128}$/.test(info.id)) {
      throw new InputValidationError(`not a session id: ${String(info.id)}`);
    }
    this.#transport = transport;
    this.sessionId = info.id;
    this.info = info;
    this.#path = `/sessions/${info.id}`;
  }

  get closed(): boolean {
    return this.#closed || this.info.closed;
  }

  get execCount(): number {
    return this.info.exec_count;
  }

  /** Run code in the session's REPL: variables, imports, cwd and env persist. With onStdout or
   * onStderr the output streams to them as it comes (a WebSocket). */
  async exec(code: string, options: ExecOptions = {}): Promise<ExecutionResult> {
    if (typeof code !== "string") throw new InputValidationError("code is a string");
    const body: Record<string, unknown> = { code };
    if (options.timeoutSeconds !== undefined && options.timeoutSeconds !== null) {
      body.timeout_seconds = options.timeoutSeconds;
    }
    if (options.envVars !== undefined && options.envVars !== null) body.env_vars = options.envVars;
    const streamed = options.onStdout !== undefined || options.onStderr !== undefined || options.signal !== undefined;
    const result = streamed
      ? await streamExec(this.#transport, `${this.#path}/exec`, body, options.onStdout, options.onStderr, options.signal)
      : resultFromWire(await this.#transport.json("POST", `${this.#path}/exec`, { json: body }));
    this.info = { ...this.info, exec_count: this.info.exec_count + 1 };
    return result;
  }

  /** Write a file (a string as UTF-8); relative paths resolve under the guest home. */
  async writeFile(path: string, content: string | Uint8Array, options: { executable?: boolean } = {}): Promise<void> {
    const body = typeof content === "string" ? new TextEncoder().encode(content) : content;
    await this.#transport.json("PUT", `${this.#path}/files/content`, {
      query: { path, executable: options.executable ?? false },
      body,
    });
  }

  async readFile(path: string): Promise<Uint8Array> {
    return this.#transport.bytes("GET", `${this.#path}/files/content`, { query: { path } });
  }

  /** The entries of a directory (default: the guest home). */
  async listFiles(path = ""): Promise<FileInfo[]> {
    return array<FileInfo>(await this.#transport.json("GET", `${this.#path}/files`, { query: { path } }), "files");
  }

  /** Install packages into the live session (pip's and npm's specs, pinned). */
  async install(packages: string[], options: { timeoutSeconds?: number } = {}): Promise<PackagesReport> {
    const body: Record<string, unknown> = { packages };
    if (options.timeoutSeconds !== undefined) body.timeout_seconds = options.timeoutSeconds;
    return object(await this.#transport.json("POST", `${this.#path}/install`, { json: body }), "packages report");
  }

  /** Save the session's state to disk and close it: scheduler.resume(snapshot.id) brings it back. */
  async pause(): Promise<SessionSnapshot> {
    const snapshot = object<SessionSnapshot>(await this.#transport.json("POST", `${this.#path}/pause`), "snapshot");
    this.#closed = true;
    return snapshot;
  }

  /** Copies of the live session: one Session without count, a list with it. */
  fork(): Promise<Session>;
  fork(count: number): Promise<Session[]>;
  async fork(count?: number): Promise<Session | Session[]> {
    const infos = array<SessionInfo>(
      await this.#transport.json("POST", `${this.#path}/fork`, { json: { count: count ?? null } }),
      "forks",
    );
    const sessions = infos.map((info) => new Session(this.#transport, info));
    return count === undefined ? sessions[0] : sessions;
  }

  /** Let other tokens (by name) use this session; the owner's or an admin's call. */
  async share(tokenNames: string[]): Promise<SessionInfo> {
    this.info = object(
      await this.#transport.json("PUT", `${this.#path}/shared_with`, { json: { shared_with: tokenNames } }),
      "session",
    );
    return this.info;
  }

  async refresh(): Promise<SessionInfo> {
    this.info = object(await this.#transport.json("GET", this.#path), "session");
    return this.info;
  }

  async networkLog(): Promise<NetworkConnection[]> {
    return array(await this.#transport.json("GET", `${this.#path}/network_log`), "network log");
  }

  /** Start a program in the background (argv, or a string for `/bin/sh -c`). */
  async spawn(cmd: string | string[], options: { cwd?: string; env?: Record<string, string> } = {}): Promise<Process> {
    const body: Record<string, unknown> = { cmd };
    if (options.cwd !== undefined) body.cwd = options.cwd;
    if (options.env !== undefined) body.env = options.env;
    const info = object<ProcessInfo>(
      await this.#transport.json("POST", `${this.#path}/processes`, { json: body }),
      "process",
    );
    return new Process(this.#transport, this.#path, info.pid);
  }

  /** The session's processes, running or ended (handles to the same pids). */
  async processes(): Promise<Process[]> {
    const infos = array<ProcessInfo>(await this.#transport.json("GET", `${this.#path}/processes`), "processes");
    return infos.map((info) => {
      const process = new Process(this.#transport, this.#path, info.pid);
      if (!info.running) process.exitCode = info.exit_code;
      return process;
    });
  }

  /** A login shell on a pseudo-terminal of cols x rows. */
  async terminal(options: { cols?: number; rows?: number } = {}): Promise<Terminal> {
    const cols = options.cols ?? 80;
    const rows = options.rows ?? 24;
    const ws = await this.#transport.websocket(`${this.#path}/terminal`, { cols, rows });
    return new Terminal(ws, cols, rows);
  }

  /** Destroy the session's VM; idempotent (a session already gone is closed). */
  async close(): Promise<void> {
    if (this.#closed) return;
    try {
      await this.#transport.json("DELETE", this.#path);
    } catch (err) {
      if (!(err instanceof SessionClosedError)) throw err;
    }
    this.#closed = true;
  }
}
