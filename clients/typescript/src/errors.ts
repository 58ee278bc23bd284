// The exceptions of the client: one class per stable error code of docs/server.md ("Errors"),
// in the same hierarchy as the Python library's, so that `instanceof TransientError` means
// what `except TransientError` means in Python. `code` is always the server's code: a class
// can stand for several codes (a server's own `not_found` is a SessionClosedError, as in the
// Python client), and a code this client does not know yet is a plain SandboxError.

export interface ErrorInit {
  code?: string;
  status?: number;
  details?: Record<string, unknown>;
}

/** "VmCapacityError" -> "vm_capacity" (wire.py's rule for the library's classes). */
function codeOf(className: string): string {
  return className
    .replace(/Error$/, "")
    .replace(/(?!^)([A-Z])/g, "_$1")
    .toLowerCase();
}

export class SandboxError extends Error {
  /** The stable code (docs/server.md): "vm_capacity", "not_found", "unauthorized", ... */
  readonly code: string;
  /** The HTTP status of the answer (0 when the error did not come from one). */
  readonly status: number;
  readonly details: Record<string, unknown>;

  constructor(message: string, init: ErrorInit = {}) {
    super(message);
    this.name = new.target.name;
    // An error made by the client itself carries its class's code, as the server names it.
    this.code = init.code ?? codeOf(new.target.name);
    this.status = init.status ?? 0;
    this.details = init.details ?? {};
  }
}

export class TransientError extends SandboxError {}
export class VmTransientError extends TransientError {}
export class VmTimeoutError extends VmTransientError {}
export class VmCapacityError extends TransientError {}
export class VolumeInUseError extends TransientError {}
export class PackageBuildError extends TransientError {}
export class PermanentError extends SandboxError {}
export class VmPermanentError extends PermanentError {}
export class VmConfigError extends PermanentError {}
export class SnapshotError extends PermanentError {}
export class TemplateError extends PermanentError {}
export class TemplateBuildError extends TemplateError {
  /** The failing step's index and its exit status (details of the answer). */
  get step(): number | null {
    return typeof this.details.step === "number" ? this.details.step : null;
  }
  get exitCode(): number | null {
    return typeof this.details.exit_code === "number" ? this.details.exit_code : null;
  }
}
export class VolumeError extends PermanentError {}
export class InputValidationError extends SandboxError {}
export class CodeValidationError extends InputValidationError {}
export class EnvVarValidationError extends InputValidationError {}
export class PackageNotAllowedError extends InputValidationError {}
export class NetworkValidationError extends InputValidationError {}
export class OutputLimitError extends SandboxError {}
export class SessionClosedError extends SandboxError {}
export class CommunicationError extends SandboxError {}
export class CommunicationOutcomeUnknownError extends CommunicationError {}
export class GuestAgentError extends CommunicationError {}
export class ProcessError extends SandboxError {}
/** A guest path that does not exist (readFile, listFiles): FileNotFoundError in Python. */
export class FileNotFoundError extends SandboxError {}

type ErrorClass = new (message: string, init?: ErrorInit) => SandboxError;

// wire.ERROR_CODES (the library's codes) and wire.SERVER_CODES (the server's own), by code.
const CLASSES: Record<string, ErrorClass> = {
  sandbox: SandboxError,
  transient: TransientError,
  vm_transient: VmTransientError,
  vm_timeout: VmTimeoutError,
  vm_capacity: VmCapacityError,
  volume_in_use: VolumeInUseError,
  package_build: PackageBuildError,
  permanent: PermanentError,
  vm_permanent: VmPermanentError,
  vm_config: VmConfigError,
  snapshot: SnapshotError,
  template: TemplateError,
  template_build: TemplateBuildError,
  volume: VolumeError,
  input_validation: InputValidationError,
  code_validation: CodeValidationError,
  env_var_validation: EnvVarValidationError,
  package_not_allowed: PackageNotAllowedError,
  network_validation: NetworkValidationError,
  output_limit: OutputLimitError,
  session_closed: SessionClosedError,
  communication: CommunicationError,
  communication_outcome_unknown: CommunicationOutcomeUnknownError,
  guest_agent: GuestAgentError,
  process: ProcessError,
  not_found: SessionClosedError,
  file_not_found: FileNotFoundError,
  unauthorized: PermanentError,
  forbidden: PermanentError,
  limit_exceeded: VmCapacityError,
  bad_request: InputValidationError,
  internal: SandboxError,
};

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** The error to throw for an error body `{"error": {code, message, details}}` (an answer's or
 * a WebSocket's final message). */
export function errorFromBody(body: unknown, status = 0): SandboxError {
  const error = isRecord(body) ? body.error : undefined;
  if (!isRecord(error)) {
    return new SandboxError(`the server answered ${status} without an error body`, {
      code: "internal",
      status,
    });
  }
  const code = typeof error.code === "string" ? error.code : "internal";
  const message = typeof error.message === "string" ? error.message : code;
  const details = isRecord(error.details) ? error.details : {};
  const cls = Object.hasOwn(CLASSES, code) ? CLASSES[code] : SandboxError;
  return new cls(message, { code, status, details });
}
