// The JSON forms this client sends and reads, the TypeScript side of exec_sandbox/wire.py:
// options go out with the Python keyword names (camelCase -> snake_case, mechanically, so a
// new option needs no change here and a misspelled one is refused by the server), results come
// back as the JSON with `{"base64"}` turned into bytes.

import { CommunicationError, InputValidationError } from "./errors.ts";
import type { ExecutionResult, PortMapping, Secret, SessionOptions, VolumeMount } from "./types.ts";

// Host callbacks and the abort signal: served by streaming, never sent. (`tools`, host callables too, cannot cross
// a process boundary at all: refused.)
const CALLBACKS = new Set(["onStdout", "onStderr", "signal"]);

export function snakeCase(name: string): string {
  return name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
}

/** run()/session() options as the members of a request body (docs/server.md, "options"). */
export function optionsToWire(options: SessionOptions & Record<string, unknown>): Record<string, unknown> {
  if (typeof options !== "object" || options === null || Array.isArray(options)) {
    throw new InputValidationError("options are an object");
  }
  const body: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(options)) {
    if (CALLBACKS.has(name) || value === undefined || value === null) continue;
    if (typeof value === "function" || name === "tools") {
      throw new InputValidationError(`option ${name}: a function cannot cross to the server`);
    }
    body[snakeCase(name)] = optionToWire(name, value);
  }
  return body;
}

function optionToWire(name: string, value: unknown): unknown {
  if (name === "exposePorts" && Array.isArray(value)) {
    return value.map((p: number | PortMapping) => (typeof p === "number" ? p : { ...p }));
  }
  if (name === "secrets" && Array.isArray(value)) {
    return value.map((s: Secret) => {
      const out: Record<string, unknown> = { name: s.name, value: s.value, hosts: s.hosts };
      if (s.headers !== undefined && s.headers !== null) out.headers = s.headers;
      if (s.replaceInBody !== undefined && s.replaceInBody !== null) out.replace_in_body = s.replaceInBody;
      return out;
    });
  }
  if (name === "volumes" && typeof value === "object" && value !== null) {
    const out: Record<string, unknown> = {};
    for (const [path, v] of Object.entries(value as Record<string, string | VolumeMount>)) {
      out[path] = typeof v === "string" ? v : { volume: v.volume, read_only: v.readOnly ?? false };
    }
    return out;
  }
  return value; // envVars, httpHeaders: their keys are the user's, kept as they are
}

function isBase64(value: unknown): value is { base64: string } {
  return (
    typeof value === "object" &&
    value !== null &&
    Object.keys(value).length === 1 &&
    typeof (value as { base64?: unknown }).base64 === "string"
  );
}

export function bytesFromWire(value: unknown): Uint8Array {
  if (!isBase64(value)) throw new CommunicationError("expected {base64} from the server");
  const buf = Buffer.from(value.base64, "base64");
  return new Uint8Array(buf.buffer, buf.byteOffset, buf.length);
}

export function object<T>(value: unknown, what: string): T {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new CommunicationError(`the server's ${what} is not an object`);
  }
  return value as T;
}

export function array<T>(value: unknown, what: string): T[] {
  if (!Array.isArray(value)) throw new CommunicationError(`the server's ${what} is not an array`);
  return value as T[];
}

/** An ExecutionResult as the server sent it, its binary outputs as bytes. */
export function resultFromWire(value: unknown): ExecutionResult {
  const result = object<ExecutionResult>(value, "result");
  if (typeof result.exit_code !== "number") throw new CommunicationError("a result without exit_code");
  if (Array.isArray(result.outputs)) {
    result.outputs = result.outputs.map((o) => (isBase64(o.data) ? { ...o, data: bytesFromWire(o.data) } : o));
  } else {
    result.outputs = [];
  }
  return result;
}
