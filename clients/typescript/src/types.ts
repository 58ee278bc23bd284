// The results of the API as plain objects, member for member the JSON of docs/server.md (the
// Python dataclasses by their field names, so `result.exit_code` here is `result.exit_code`
// there). The one conversion: `{"base64": ...}` (Output.data of non-text MIME types) becomes a
// Uint8Array. A newer server may add members; they pass through untyped.

export type Language = "python" | "javascript" | "typescript" | "ts" | "raw";

export interface TimingBreakdown {
  setup_ms: number;
  boot_ms: number;
  execute_ms: number;
  total_ms: number;
  admission_ms: number;
  restore_ms: number;
  connect_ms: number;
  packages_ms: number;
}

export interface PackagesReport {
  packages: string[];
  cache_hit: boolean;
  resolved: boolean;
  build_ms: Record<string, number>;
  size_bytes: number;
}

export interface ExposedPort {
  internal: number;
  external: number;
  host: string;
  protocol: string;
}

export interface HttpRequestRecord {
  method: string;
  path: string;
  status: number;
  bytes_sent: number;
  bytes_received: number;
  secrets: string[];
  error: string;
}

export interface NetworkConnection {
  direction: "outbound" | "inbound";
  name: string;
  port: number;
  allowed: boolean;
  reason: string;
  addresses: string[];
  bytes_sent: number;
  bytes_received: number;
  duration_ms: number;
  started_at: number;
  still_open: boolean;
  reported_by_guest: boolean;
  http_requests: HttpRequestRecord[];
}

export interface Output {
  mime_type: string;
  /** Text for text MIME types, bytes otherwise (an image's PNG). */
  data: string | Uint8Array;
}

export interface ToolCall {
  name: string;
  arguments: string;
  ok: boolean;
  error: string | null;
  duration_ms: number;
}

export interface ExecutionResult {
  stdout: string;
  stderr: string;
  /** 0 success, n the program's status, 128+N killed by signal N, -1 timeout. */
  exit_code: number;
  execution_time_ms: number | null;
  external_cpu_time_ms: number | null;
  external_memory_peak_mb: number | null;
  timing: TimingBreakdown;
  warm_pool_hit: boolean;
  l1_cache_hit: boolean;
  exposed_ports: ExposedPort[];
  packages: PackagesReport | null;
  network_log: NetworkConnection[];
  outputs: Output[];
  tool_calls: ToolCall[];
}

export interface FileInfo {
  name: string;
  is_dir: boolean;
  size: number;
}

export interface SessionInfo {
  id: string;
  language: Language;
  owner: string;
  shared_with: string[];
  exec_count: number;
  closed: boolean;
  close_reason: string;
  installed: string[];
  exposed_ports: ExposedPort[];
  created_at: number;
}

export interface SessionSnapshot {
  id: string;
  language: Language;
  memory_mb: number;
  created_at: number;
  size_bytes: number;
  exec_count: number;
  packages: string[];
}

export interface ProcessInfo {
  pid: number;
  command: string;
  running: boolean;
  /** null while running; 128+N when killed by signal N. */
  exit_code: number | null;
  pty: boolean;
  stdin_open: boolean;
  stdout_bytes: number;
  stderr_bytes: number;
}

export interface Template {
  name: string;
  digest: string;
  size_bytes: number;
  languages: Record<string, string>;
  env: Record<string, string>;
  workdir: string;
  memory_mb: number | null;
  vcpus: number | null;
  source: string;
  created_at: number;
  build_ms: number;
}

export interface Volume {
  name: string;
  size_mb: number;
  created_at: number;
}

export interface ServerInfo {
  principal: string;
  scopes: string[];
  accelerator: string;
  version: string;
  limits: Record<string, unknown>;
}

// --- what goes in -----------------------------------------------------------------------

export interface PortMapping {
  internal: number;
  external?: number | null;
  protocol?: string;
}

export interface Secret {
  name: string;
  value: string;
  hosts: string[];
  headers?: string[] | null;
  replaceInBody?: boolean | null;
}

export interface VolumeMount {
  volume: string;
  readOnly?: boolean;
}

/** A callback for streamed output: called with each piece of text as the code writes it. */
export type OutputCallback = (text: string) => void;

/** run()/session() options: the Python keyword arguments in camelCase (docs/server.md,
 * "options"). Unknown ones are refused by the server (input_validation). */
export interface SessionOptions {
  language?: Language;
  packages?: string[];
  timeoutSeconds?: number | null;
  memoryMb?: number | null;
  vcpus?: number | null;
  diskMb?: number | null;
  template?: string | null;
  allowNetwork?: boolean;
  allowedDomains?: string[] | null;
  envVars?: Record<string, string> | null;
  exposePorts?: Array<number | PortMapping> | null;
  secrets?: Secret[] | null;
  httpHeaders?: Record<string, Record<string, string>> | null;
  volumes?: Record<string, string | VolumeMount> | null;
}

export interface RunOptions extends SessionOptions {
  /** Given: the run streams over a WebSocket and these see the output as it comes. */
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
  /** Aborting it cancels the run (its VM destroyed) and rejects with the signal's reason; a
   * run with a signal streams over a WebSocket, whose end is what cancels it. */
  signal?: AbortSignal;
}

export interface ExecOptions {
  timeoutSeconds?: number | null;
  envVars?: Record<string, string> | null;
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
  /** Aborting it stops waiting (rejects with the signal's reason); the code still runs to
   * its end in the session, and the session's next call waits for it. */
  signal?: AbortSignal;
}

export type TemplateStep =
  | { run: string; user?: string }
  | { env: Record<string, string> }
  | { workdir: string }
  | { user: string };
