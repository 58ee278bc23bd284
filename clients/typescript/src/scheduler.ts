// The client of `sbx serve`: the Python Scheduler's API over HTTP and WebSocket
// (docs/server.md). `new Scheduler({ socketPath })` on the server's Unix socket (`new
// Scheduler()`: its default one), or `new Scheduler({ url, token })` over TCP.

import { InputValidationError } from "./errors.ts";
import { Session } from "./session.ts";
import { streamExec } from "./streaming.ts";
import { type ClientOptions, type ConnectOptions, Transport } from "./transport.ts";
import type {
  ExecutionResult,
  RunOptions,
  ServerInfo,
  SessionInfo,
  SessionOptions,
  SessionSnapshot,
  Template,
  TemplateStep,
  Volume,
} from "./types.ts";
import { array, object, optionsToWire, resultFromWire } from "./wire.ts";

export class Scheduler {
  readonly #transport: Transport;

  /** Without connect: the Unix socket where `sbx serve` listens by default. */
  constructor(connect?: ConnectOptions, options: ClientOptions = {}) {
    this.#transport = new Transport(connect, options);
  }

  /** `{status: "ok", version}`; needs no token. */
  async health(): Promise<{ status: string; version: string }> {
    return object(await this.#transport.json("GET", "/health"), "health");
  }

  /** Who the server takes this client for, and what it may do. */
  async info(): Promise<ServerInfo> {
    return object(await this.#transport.json("GET", "/info"), "info");
  }

  /** Run code in a fresh VM, destroyed afterwards. With onStdout or onStderr the output streams
   * to them as the code writes it (a WebSocket); with a signal, aborting cancels the run. */
  async run(code: string, options: RunOptions = {}): Promise<ExecutionResult> {
    if (typeof code !== "string") throw new InputValidationError("code is a string");
    const body = { code, ...optionsToWire(options as SessionOptions & Record<string, unknown>) };
    if (options.onStdout !== undefined || options.onStderr !== undefined || options.signal !== undefined) {
      return streamExec(this.#transport, "/run", body, options.onStdout, options.onStderr, options.signal);
    }
    return resultFromWire(await this.#transport.json("POST", "/run", { json: body }));
  }

  /** A live session: a VM with a persistent REPL until close(). */
  async session(options: SessionOptions = {}): Promise<Session> {
    const body = optionsToWire(options as SessionOptions & Record<string, unknown>);
    return new Session(this.#transport, await this.#transport.json<SessionInfo>("POST", "/sessions", { json: body }));
  }

  /** The sessions this token can see. */
  async sessions(): Promise<SessionInfo[]> {
    return array(await this.#transport.json("GET", "/sessions"), "sessions");
  }

  /** A handle to an existing session by id (one shared with this token, or one of another
   * client of the same token). */
  async getSession(id: string): Promise<Session> {
    return new Session(this.#transport, await this.#transport.json<SessionInfo>("GET", `/sessions/${encodeURIComponent(id)}`));
  }

  /** A paused session, live again; the snapshot stays (resume it again, or deleteSnapshot()). */
  async resume(snapshotId: string): Promise<Session> {
    const info = await this.#transport.json<SessionInfo>("POST", `/snapshots/${encodeURIComponent(snapshotId)}/resume`);
    return new Session(this.#transport, info);
  }

  async snapshots(): Promise<SessionSnapshot[]> {
    return array(await this.#transport.json("GET", "/snapshots"), "snapshots");
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    await this.#transport.json("DELETE", `/snapshots/${encodeURIComponent(snapshotId)}`);
  }

  async templates(): Promise<Template[]> {
    return array(await this.#transport.json("GET", "/templates"), "templates");
  }

  /** Build a template (admin scope): steps run in order on `base` (or an image). */
  async buildTemplate(
    name: string,
    options: { steps?: TemplateStep[]; image?: string; base?: string } = {},
  ): Promise<Template> {
    const body: Record<string, unknown> = { name, steps: options.steps ?? [] };
    if (options.image !== undefined) body.image = options.image;
    if (options.base !== undefined) body.base = options.base;
    return object(await this.#transport.json("POST", "/templates", { json: body }), "template");
  }

  async deleteTemplate(name: string): Promise<void> {
    await this.#transport.json("DELETE", `/templates/${encodeURIComponent(name)}`);
  }

  async volumes(): Promise<Volume[]> {
    return array(await this.#transport.json("GET", "/volumes"), "volumes");
  }

  /** Create a volume (admin scope), or get the one of that name. */
  async volume(name: string, options: { sizeMb?: number } = {}): Promise<Volume> {
    const body: Record<string, unknown> = { name };
    if (options.sizeMb !== undefined) body.size_mb = options.sizeMb;
    return object(await this.#transport.json("POST", "/volumes", { json: body }), "volume");
  }

  async deleteVolume(name: string): Promise<void> {
    await this.#transport.json("DELETE", `/volumes/${encodeURIComponent(name)}`);
  }

  /** End the client's idle connections (sessions stay on the server). */
  close(): void {
    this.#transport.close();
  }
}
