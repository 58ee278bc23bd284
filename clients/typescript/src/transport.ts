// How the client reaches `sbx serve`: HTTP/1.1 over its Unix socket (no token: the socket's
// file mode is the authentication) or over TCP with a bearer token (docs/server.md,
// "Authentication"). node:http serves both (`socketPath`), and its `upgrade` event carries the
// WebSockets. One keep-alive agent per client; close() ends its sockets.

import * as http from "node:http";
import * as https from "node:https";
import { homedir } from "node:os";
import { join } from "node:path";

import { CommunicationError, errorFromBody, InputValidationError, SandboxError } from "./errors.ts";
import { awaitUpgrade, handshakeHeaders, type WebSocket, type WebSocketOptions } from "./websocket.ts";

export const API_PREFIX = "/v1";
/** A JSON answer larger than this is refused: results are bounded by the library's limits
 * (stdout 1 MB, stderr 100 KB, outputs), far below. */
const MAX_JSON_BYTES = 64 * 1024 * 1024;
/** A file's content: the library's per-file limit (500 MB) and some room. */
const MAX_CONTENT_BYTES = 512 * 1024 * 1024;

export type ConnectOptions =
  | { socketPath: string; url?: undefined; token?: undefined }
  | { url: string; token?: string; socketPath?: undefined };

/** Bounds of the client's WebSockets (streamed runs and execs, processes, terminals):
 * `maxMessageBytes` (64 MiB), `handshakeTimeoutMs` (10 s), `pingIntervalMs` (20 s of quiet
 * before a keepalive ping; 0: none) and `pingTimeoutMs` (60 s for its answer). */
export type ClientOptions = WebSocketOptions;

const IDEMPOTENT = new Set(["GET", "HEAD", "PUT", "DELETE"]);
const RETRY = Symbol("retry");

type Query = Record<string, string | number | boolean | null | undefined>;

interface RequestInit {
  query?: Query;
  json?: unknown;
  body?: Uint8Array;
  maxBytes?: number;
}

/** Where `sbx serve` listens unless told otherwise (exec_sandbox.paths.server_socket):
 * $XDG_RUNTIME_DIR/exec-sandbox/sbx.sock, else sbx.sock in its state directory
 * ($EXEC_SANDBOX_STATE_DIR, $XDG_STATE_HOME/exec-sandbox, ~/.local/state/exec-sandbox). */
export function defaultSocketPath(env: Record<string, string | undefined> = process.env): string {
  if (env.XDG_RUNTIME_DIR) return join(env.XDG_RUNTIME_DIR, "exec-sandbox", "sbx.sock");
  const state =
    env.EXEC_SANDBOX_STATE_DIR ||
    join(env.XDG_STATE_HOME || join(homedir(), ".local", "state"), "exec-sandbox");
  return join(state, "sbx.sock");
}

export class Transport {
  readonly #base: http.RequestOptions;
  readonly #module: typeof http | typeof https;
  readonly #agent: http.Agent;
  readonly #token: string | undefined;
  readonly #websocketOptions: WebSocketOptions;

  constructor(connect: ConnectOptions = { socketPath: defaultSocketPath() }, options: ClientOptions = {}) {
    this.#websocketOptions = { ...options };
    if (typeof connect.socketPath === "string") {
      this.#module = http;
      this.#agent = new http.Agent({ keepAlive: true });
      this.#base = { socketPath: connect.socketPath };
      this.#token = undefined;
      return;
    }
    if (typeof connect.url !== "string") {
      throw new InputValidationError("new Scheduler() needs { socketPath } or { url, token }");
    }
    let url: URL;
    try {
      url = new URL(connect.url);
    } catch {
      throw new InputValidationError(`not a URL: ${connect.url}`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new InputValidationError(`a server URL is http:// or https://, not ${url.protocol}`);
    }
    const secure = url.protocol === "https:";
    this.#module = secure ? https : http;
    this.#agent = secure ? new https.Agent({ keepAlive: true }) : new http.Agent({ keepAlive: true });
    this.#base = {
      host: url.hostname.replace(/^\[|\]$/g, ""),
      port: url.port === "" ? (secure ? 443 : 80) : Number(url.port),
    };
    this.#token = connect.token;
  }

  /** One call whose answer is JSON (or 204: undefined). Errors become SandboxError. */
  async json<T>(method: string, path: string, init: RequestInit = {}): Promise<T> {
    const { status, body } = await this.request(method, path, init);
    if (status === 204 || body.length === 0) return undefined as T;
    return parseJson(body) as T;
  }

  /** One call whose answer is raw bytes (a file's content). */
  async bytes(method: string, path: string, init: RequestInit = {}): Promise<Uint8Array> {
    const { body } = await this.request(method, path, { maxBytes: MAX_CONTENT_BYTES, ...init });
    return new Uint8Array(body.buffer, body.byteOffset, body.length);
  }

  async request(method: string, path: string, init: RequestInit): Promise<{ status: number; body: Buffer }> {
    const headers: Record<string, string> = { ...this.#auth(), Accept: "application/json" };
    let payload: Buffer | undefined;
    if (init.json !== undefined) {
      payload = Buffer.from(JSON.stringify(init.json), "utf8");
      headers["Content-Type"] = "application/json";
    } else if (init.body !== undefined) {
      payload = Buffer.from(init.body.buffer, init.body.byteOffset, init.body.byteLength);
      headers["Content-Type"] = "application/octet-stream";
    }
    if (payload !== undefined) headers["Content-Length"] = String(payload.length);
    const maxBytes = init.maxBytes ?? MAX_JSON_BYTES;
    const send = () =>
      new Promise<http.IncomingMessage>((resolve, reject) => {
        const request = this.#module.request(
          { ...this.#base, agent: this.#agent, method, path: this.#path(path, init.query), headers },
          resolve,
        );
        request.on("error", (err: NodeJS.ErrnoException) => {
          // A pooled connection the server was closing as we reused it (it most likely never
          // read the request): said again on a new connection where twice does no harm.
          const stale = request.reusedSocket && err.code === "ECONNRESET";
          reject(stale && IDEMPOTENT.has(method) ? RETRY : new CommunicationError(`${method} ${path}: ${err.message}`));
        });
        request.end(payload);
      });
    let response: http.IncomingMessage;
    try {
      response = await send();
    } catch (err) {
      if (err !== RETRY) throw err;
      response = await send().catch((again) => {
        throw again === RETRY ? new CommunicationError(`${method} ${path}: the connection was reset`) : again;
      });
    }
    const body = await readBody(response, maxBytes);
    const status = response.statusCode ?? 0;
    if (status < 200 || status >= 300) throw errorOf(body, status);
    return { status, body };
  }

  /** Open a WebSocket on path (docs/server.md, "Streaming"). */
  async websocket(path: string, query?: Query): Promise<WebSocket> {
    const { key, headers } = handshakeHeaders();
    const request = this.#module.request({
      ...this.#base,
      // A WebSocket owns its socket for its whole life: never one of the agent's pooled ones.
      agent: false,
      method: "GET",
      path: this.#path(path, query),
      headers: { ...headers, ...this.#auth() },
    });
    const answer = await awaitUpgrade(request, key, this.#websocketOptions);
    if ("ws" in answer) return answer.ws;
    const body = await readBody(answer.refused, MAX_JSON_BYTES);
    throw errorOf(body, answer.refused.statusCode ?? 0);
  }

  /** End the keep-alive sockets (the process can exit once nothing else is open). */
  close(): void {
    this.#agent.destroy();
  }

  #auth(): Record<string, string> {
    return this.#token === undefined ? {} : { Authorization: `Bearer ${this.#token}` };
  }

  #path(path: string, query?: Query): string {
    let full = API_PREFIX + path;
    if (query !== undefined) {
      const params = new URLSearchParams();
      for (const [name, value] of Object.entries(query)) {
        if (value !== undefined && value !== null) params.set(name, String(value));
      }
      const text = params.toString();
      if (text !== "") full += `?${text}`;
    }
    return full;
  }
}

function readBody(response: http.IncomingMessage, maxBytes: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const declared = Number(response.headers["content-length"] ?? "0");
    if (declared > maxBytes) {
      response.destroy();
      reject(new CommunicationError(`an answer of ${declared} bytes (the limit is ${maxBytes})`));
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    response.on("data", (chunk: Buffer) => {
      size += chunk.length;
      if (size > maxBytes) {
        response.destroy();
        reject(new CommunicationError(`an answer over ${maxBytes} bytes`));
        return;
      }
      chunks.push(chunk);
    });
    response.on("end", () => resolve(Buffer.concat(chunks, size)));
    response.on("error", (err: Error) => reject(new CommunicationError(err.message)));
    response.on("aborted", () => reject(new CommunicationError("the answer was cut short")));
  });
}

function parseJson(body: Buffer): unknown {
  try {
    return JSON.parse(body.toString("utf8"));
  } catch {
    throw new CommunicationError(`the server answered something other than JSON: ${body.subarray(0, 80).toString()}`);
  }
}

function errorOf(body: Buffer, status: number): SandboxError {
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.toString("utf8"));
  } catch {
    parsed = undefined;
  }
  return errorFromBody(parsed, status);
}
