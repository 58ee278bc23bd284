// exec-sandbox's TypeScript client: the API of `sbx serve` (docs/server.md).
export * from "./errors.ts";
export { Process, Terminal, TimeoutError } from "./process.ts";
export { Scheduler } from "./scheduler.ts";
export { Session } from "./session.ts";
export { type ClientOptions, type ConnectOptions, defaultSocketPath } from "./transport.ts";
export type * from "./types.ts";
export { WebSocket, type WebSocketMessage } from "./websocket.ts";
