// Exec output as it comes (docs/server.md, "Streaming"): `WS /run` and
// `WS /sessions/{id}/exec` take the REST call's body as the first message and answer with
// stdout/stderr messages and one final result or error.

import { CommunicationError, errorFromBody, type SandboxError } from "./errors.ts";
import type { Transport } from "./transport.ts";
import type { ExecutionResult, OutputCallback } from "./types.ts";
import { CLOSE_TOKEN_INVALID, type WebSocket } from "./websocket.ts";
import { object, resultFromWire } from "./wire.ts";

interface StreamMessage {
  type?: unknown;
  data?: unknown;
  result?: unknown;
  error?: unknown;
}

export async function streamExec(
  transport: Transport,
  path: string,
  body: Record<string, unknown>,
  onStdout: OutputCallback | undefined,
  onStderr: OutputCallback | undefined,
  signal?: AbortSignal,
): Promise<ExecutionResult> {
  signal?.throwIfAborted();
  const ws = await transport.websocket(path);
  // An abort drops the connection at once: the server then cancels a run (its VM destroyed)
  // and lets a session's exec finish unread (docs/server.md, "Streaming").
  let onAbort: (() => void) | undefined;
  const aborted =
    signal === undefined
      ? undefined
      : new Promise<never>((_, reject) => {
          onAbort = () => {
            ws.destroy();
            reject(signal.reason);
          };
          signal.addEventListener("abort", onAbort, { once: true });
        });
  aborted?.catch(() => {}); // rejected only when raced below; never left unhandled
  let dropped = false;
  try {
    await ws.sendJson(body);
    for (;;) {
      signal?.throwIfAborted();
      const message = await (aborted === undefined ? ws.receive() : Promise.race([ws.receive(), aborted]));
      if (message === null) throw closedError(ws, `${path}: the stream ended without a result`);
      if (message.type !== "text") throw new CommunicationError(`${path}: a binary message in an exec stream`);
      const parsed = object<StreamMessage>(JSON.parse(message.data), "stream message");
      switch (parsed.type) {
        case "stdout":
          if (typeof parsed.data === "string") onStdout?.(parsed.data);
          break;
        case "stderr":
          if (typeof parsed.data === "string") onStderr?.(parsed.data);
          break;
        case "result":
          return resultFromWire(parsed.result);
        case "error":
          throw errorFromBody(parsed);
        default:
          break; // a newer server's message: ignored, as unknown members are
      }
    }
  } catch (err) {
    dropped = signal?.aborted ?? false;
    throw err;
  } finally {
    if (onAbort !== undefined) signal?.removeEventListener("abort", onAbort);
    // Done or given up: either way the server's side of this stream ends with ours.
    if (dropped) ws.destroy();
    else await ws.close();
  }
}

/** The error for a stream the server closed before its end: `unauthorized` (as the next request
 * would be answered) when the token was revoked or expired while it was open; else a
 * CommunicationError naming the close (1013: this client read too slowly for the server's
 * bounded queue, docs/server.md). */
export function closedError(ws: WebSocket, what: string): SandboxError {
  if (ws.closeCode === CLOSE_TOKEN_INVALID) {
    const reason = ws.closeReason || "the token was revoked or has expired";
    return errorFromBody({ error: { code: "unauthorized", message: `${what}: ${reason}` } }, 401);
  }
  const why = ws.closeCode === null ? "" : ` (close ${ws.closeCode}${ws.closeReason ? `: ${ws.closeReason}` : ""})`;
  return new CommunicationError(`${what}${why}`);
}
