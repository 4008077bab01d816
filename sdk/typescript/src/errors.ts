/**
 * Errors as classes carrying the services' stable codes.
 *
 * Every failure the SDK reports is an {@link AgentReachError} with `code` (the stable,
 * upper-case code the service answered, e.g. `SCHEMA_MISMATCH`), `message`, `status`
 * (the HTTP status, when one was received), `retryable` and `details`. Each service has
 * its base class ({@link RouterError}, {@link RegistryError}, {@link ContextError}) and
 * the codes callers branch on most have a class of their own, so both styles work:
 *
 * ```ts
 * try {
 *   await client.invoke("order.query", { order_id: "SO-1" });
 * } catch (error) {
 *   if (error instanceof SchemaMismatch) console.log(error.details);
 *   else if (error instanceof RouterError && error.code === RouterCode.NO_AVAILABLE_INSTANCE) retryLater();
 * }
 * ```
 *
 * The router's list is DESIGN §3.8's table (a test holds it there); the registry's and
 * the context service's are §2.8 and §4.6.
 */

/** The router's stable codes (DESIGN §3.8), plus `INTERNAL`, its last-resort answer (§3.7). */
export const RouterCode = {
  INVALID_ENVELOPE: "INVALID_ENVELOPE",
  INVALID_QUERY: "INVALID_QUERY",
  UNAUTHENTICATED: "UNAUTHENTICATED",
  FORBIDDEN: "FORBIDDEN",
  CAPABILITY_NOT_FOUND: "CAPABILITY_NOT_FOUND",
  VERSION_NOT_FOUND: "VERSION_NOT_FOUND",
  PAYLOAD_TOO_LARGE: "PAYLOAD_TOO_LARGE",
  SCHEMA_MISMATCH: "SCHEMA_MISMATCH",
  OVERLOADED: "OVERLOADED",
  AGENT_ERROR: "AGENT_ERROR",
  ALL_RETRIES_EXHAUSTED: "ALL_RETRIES_EXHAUSTED",
  NO_AVAILABLE_INSTANCE: "NO_AVAILABLE_INSTANCE",
  DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED",
  NOT_FOUND: "NOT_FOUND",
  METHOD_NOT_ALLOWED: "METHOD_NOT_ALLOWED",
  TASKS_DISABLED: "TASKS_DISABLED",
  TASK_NOT_FOUND: "TASK_NOT_FOUND",
  TASK_CONFLICT: "TASK_CONFLICT",
  INVALID_TASK_RESULT: "INVALID_TASK_RESULT",
  DEAD_LETTER_NOT_FOUND: "DEAD_LETTER_NOT_FOUND",
  TASK_STORE_UNAVAILABLE: "TASK_STORE_UNAVAILABLE",
  TASK_BUFFER_FULL: "TASK_BUFFER_FULL",
  RATE_LIMITED: "RATE_LIMITED",
  OUTPUT_SCHEMA_MISMATCH: "OUTPUT_SCHEMA_MISMATCH",
  STREAM_INTERRUPTED: "STREAM_INTERRUPTED",
  ASSERTION_FAILED: "ASSERTION_FAILED",
  INVALID_CALLBACK: "INVALID_CALLBACK",
  CANCELED: "CANCELED",
  WORKFLOW_NOT_FOUND: "WORKFLOW_NOT_FOUND",
  RUN_NOT_FOUND: "RUN_NOT_FOUND",
  RUN_CONFLICT: "RUN_CONFLICT",
  STEP_FAILED: "STEP_FAILED",
  TRAIL_DISABLED: "TRAIL_DISABLED",
  DEPTH_EXCEEDED: "DEPTH_EXCEEDED",
  LOOP_DETECTED: "LOOP_DETECTED",
  BUDGET_EXHAUSTED: "BUDGET_EXHAUSTED",
  INTERNAL: "INTERNAL",
} as const;
export type RouterCode = (typeof RouterCode)[keyof typeof RouterCode];

/** Codes of the registry's error answers (DESIGN §2.8). */
export const RegistryCode = {
  MALFORMED_JSON: "MALFORMED_JSON",
  MISSING_FIELD: "MISSING_FIELD",
  INVALID_FIELD_TYPE: "INVALID_FIELD_TYPE",
  UNKNOWN_FIELD: "UNKNOWN_FIELD",
  PAYLOAD_TOO_LARGE: "PAYLOAD_TOO_LARGE",
  INVALID_AGENT_ID: "INVALID_AGENT_ID",
  INVALID_NAME: "INVALID_NAME",
  INVALID_ENDPOINT: "INVALID_ENDPOINT",
  INVALID_PROTOCOL: "INVALID_PROTOCOL",
  INVALID_WEIGHT: "INVALID_WEIGHT",
  INVALID_TTL: "INVALID_TTL",
  INVALID_STATUS: "INVALID_STATUS",
  INVALID_TAGS: "INVALID_TAGS",
  NO_CAPABILITIES: "NO_CAPABILITIES",
  INVALID_CAPABILITY_NAME: "INVALID_CAPABILITY_NAME",
  INVALID_VERSION: "INVALID_VERSION",
  INVALID_VERSION_REQ: "INVALID_VERSION_REQ",
  INVALID_SCHEMA: "INVALID_SCHEMA",
  SCHEMA_TOO_LARGE: "SCHEMA_TOO_LARGE",
  SCHEMA_TOO_DEEP: "SCHEMA_TOO_DEEP",
  INVALID_TIMEOUT: "INVALID_TIMEOUT",
  DUPLICATE_CAPABILITY: "DUPLICATE_CAPABILITY",
  UNAUTHENTICATED: "UNAUTHENTICATED",
  FORBIDDEN: "FORBIDDEN",
  AGENT_ID_TAKEN: "AGENT_ID_TAKEN",
  AGENT_NOT_FOUND: "AGENT_NOT_FOUND",
  CAPABILITY_NOT_FOUND: "CAPABILITY_NOT_FOUND",
  VERSION_NOT_FOUND: "VERSION_NOT_FOUND",
  LEASE_EXPIRED: "LEASE_EXPIRED",
  INVALID_STATUS_TRANSITION: "INVALID_STATUS_TRANSITION",
  INVALID_ACCESS_REQUEST: "INVALID_ACCESS_REQUEST",
  ACCESS_REQUEST_NOT_FOUND: "ACCESS_REQUEST_NOT_FOUND",
  GRANT_NOT_FOUND: "GRANT_NOT_FOUND",
  ALREADY_ALLOWED: "ALREADY_ALLOWED",
  ALREADY_DECIDED: "ALREADY_DECIDED",
  NO_OWNER: "NO_OWNER",
  CONFLICT: "CONFLICT",
  NOT_FOUND: "NOT_FOUND",
  STORE_UNAVAILABLE: "STORE_UNAVAILABLE",
  INTERNAL: "INTERNAL",
} as const;
export type RegistryCode = (typeof RegistryCode)[keyof typeof RegistryCode];

/** Codes of the context service's error answers (DESIGN §4.6). */
export const ContextCode = {
  MALFORMED_JSON: "MALFORMED_JSON",
  MISSING_FIELD: "MISSING_FIELD",
  INVALID_FIELD_TYPE: "INVALID_FIELD_TYPE",
  UNKNOWN_FIELD: "UNKNOWN_FIELD",
  INVALID_QUERY: "INVALID_QUERY",
  PAYLOAD_TOO_LARGE: "PAYLOAD_TOO_LARGE",
  INVALID_CONTEXT_ID: "INVALID_CONTEXT_ID",
  INVALID_TIER: "INVALID_TIER",
  INVALID_FIELD_NAME: "INVALID_FIELD_NAME",
  INVALID_FIELD_VALUE: "INVALID_FIELD_VALUE",
  CREDENTIAL_FIELD: "CREDENTIAL_FIELD",
  EMPTY_PATCH: "EMPTY_PATCH",
  CONFLICTING_PATCH: "CONFLICTING_PATCH",
  FIELD_TOO_LARGE: "FIELD_TOO_LARGE",
  TOO_MANY_FIELDS: "TOO_MANY_FIELDS",
  CONTEXT_TOO_LARGE: "CONTEXT_TOO_LARGE",
  UNAUTHENTICATED: "UNAUTHENTICATED",
  FORBIDDEN: "FORBIDDEN",
  CONTEXT_NOT_FOUND: "CONTEXT_NOT_FOUND",
  CONTEXT_EXISTS: "CONTEXT_EXISTS",
  VERSION_CONFLICT: "VERSION_CONFLICT",
  NOT_FOUND: "NOT_FOUND",
  METHOD_NOT_ALLOWED: "METHOD_NOT_ALLOWED",
  CONTEXT_STORE_UNAVAILABLE: "CONTEXT_STORE_UNAVAILABLE",
  INTERNAL: "INTERNAL",
} as const;
export type ContextCode = (typeof ContextCode)[keyof typeof ContextCode];

export type Details = Record<string, unknown>;

export interface ErrorFields {
  status?: number | undefined;
  retryable?: boolean | undefined;
  details?: Details | undefined;
}

/** A failure with a stable code: the base of every error the SDK raises for a service's answer. */
export class AgentReachError extends Error {
  readonly code: string;
  readonly status: number | undefined;
  readonly retryable: boolean;
  readonly details: Details;

  constructor(code: string, message: string, fields: ErrorFields = {}) {
    super(message);
    this.name = new.target.name;
    this.code = code;
    this.status = fields.status;
    this.retryable = fields.retryable ?? false;
    this.details = fields.details ?? {};
  }
}

/**
 * A service could not be reached, or answered something that is not its API: codes
 * `ROUTER_UNREACHABLE`, `REGISTRY_UNREACHABLE`, `CONTEXT_UNREACHABLE` (retryable) and
 * `INVALID_ANSWER`.
 */
export class TransportError extends AgentReachError {}

/** An agent or client configured wrongly; `problems` lists every problem at once. */
export class ConfigError extends AgentReachError {
  readonly problems: readonly string[];

  constructor(problems: readonly string[]) {
    super("INVALID_CONFIG", problems.join("; "));
    this.problems = problems;
  }
}

/** A handler that cannot be registered as declared (name, version, schema); thrown at declaration. */
export class HandlerDefinitionError extends AgentReachError {
  constructor(capability: string, problem: string) {
    super("INVALID_HANDLER", `handler for \`${capability}\`: ${problem}`);
  }
}

// === Router ===

export interface RouterErrorFields extends ErrorFields {
  requestId?: string | undefined;
  /** The whole failed result envelope, when there was one. */
  envelope?: Record<string, unknown> | undefined;
}

/** A failed result envelope from the router (`status: "failed"`), or an `event: error` of a stream. */
export class RouterError extends AgentReachError {
  readonly requestId: string | undefined;
  readonly envelope: Record<string, unknown>;

  constructor(code: string, message: string, fields: RouterErrorFields = {}) {
    super(code, message, fields);
    this.requestId = fields.requestId;
    this.envelope = fields.envelope ?? {};
  }
}

export class InvalidEnvelope extends RouterError {}
export class Unauthenticated extends RouterError {}
export class Forbidden extends RouterError {}
export class CapabilityNotFound extends RouterError {}
export class VersionNotFound extends RouterError {}
export class PayloadTooLarge extends RouterError {}
/** The payload does not match the capability's input schema; `details.errors` name the JSON pointers. */
export class SchemaMismatch extends RouterError {}
export class Overloaded extends RouterError {}
export class RateLimited extends RouterError {}
/** Every attempt met an unavailable instance, or the retry budget is spent. */
export class AllRetriesExhausted extends RouterError {}
export class NoAvailableInstance extends RouterError {}
export class DeadlineExceeded extends RouterError {}
export class TaskNotFound extends RouterError {}
export class TasksDisabled extends RouterError {}
/** The agent's stream broke after events were relayed (retryable by the caller). */
export class StreamInterrupted extends RouterError {}

/** The agent's own business error, passed through and never retried. */
export class AgentError extends RouterError {
  /** The code the agent answered. */
  get agentCode(): string {
    const code = this.details["agent_code"];
    return typeof code === "string" ? code : "";
  }

  /** The HTTP status the agent answered. */
  get agentStatus(): number | undefined {
    const status = this.details["agent_status"];
    return typeof status === "number" ? status : undefined;
  }
}

const ROUTER_CLASSES: Partial<Record<string, typeof RouterError>> = {
  [RouterCode.INVALID_ENVELOPE]: InvalidEnvelope,
  [RouterCode.UNAUTHENTICATED]: Unauthenticated,
  [RouterCode.FORBIDDEN]: Forbidden,
  [RouterCode.CAPABILITY_NOT_FOUND]: CapabilityNotFound,
  [RouterCode.VERSION_NOT_FOUND]: VersionNotFound,
  [RouterCode.PAYLOAD_TOO_LARGE]: PayloadTooLarge,
  [RouterCode.SCHEMA_MISMATCH]: SchemaMismatch,
  [RouterCode.OVERLOADED]: Overloaded,
  [RouterCode.RATE_LIMITED]: RateLimited,
  [RouterCode.AGENT_ERROR]: AgentError,
  [RouterCode.ALL_RETRIES_EXHAUSTED]: AllRetriesExhausted,
  [RouterCode.NO_AVAILABLE_INSTANCE]: NoAvailableInstance,
  [RouterCode.DEADLINE_EXCEEDED]: DeadlineExceeded,
  [RouterCode.TASK_NOT_FOUND]: TaskNotFound,
  [RouterCode.TASKS_DISABLED]: TasksDisabled,
  [RouterCode.STREAM_INTERRUPTED]: StreamInterrupted,
};

/** The most specific {@link RouterError} class for `code`. */
export function routerError(code: string, message: string, fields: RouterErrorFields = {}): RouterError {
  const Class = ROUTER_CLASSES[code] ?? RouterError;
  return new Class(code, message, fields);
}

// === Registry and context service ===

export interface ServiceErrorFields extends ErrorFields {
  /** The request field at fault, when the service named one. */
  field?: string | undefined;
}

/** An error answer of the registry. */
export class RegistryError extends AgentReachError {
  readonly field: string | undefined;

  constructor(code: string, message: string, fields: ServiceErrorFields = {}) {
    super(code, message, fields);
    this.field = fields.field;
  }
}

/** The instance's lease is gone; the SDK registers again by itself. */
export class LeaseExpired extends RegistryError {}

/** The registry refused the registration (thrown by `Agent.start`); names the capability at fault when it can. */
export class RegistrationRefused extends RegistryError {}

/** An error answer of the context service. */
export class ContextError extends AgentReachError {
  readonly field: string | undefined;

  constructor(code: string, message: string, fields: ServiceErrorFields = {}) {
    super(code, message, fields);
    this.field = fields.field;
  }
}

/** A conditional patch found another version: re-read and retry. */
export class VersionConflict extends ContextError {
  get currentVersion(): number | undefined {
    const version = this.details["current_version"];
    return typeof version === "number" ? version : undefined;
  }
}

/** No such context: never created, closed, expired or swept as idle. */
export class ContextNotFound extends ContextError {}

// === Handlers ===

export interface HandlerErrorOptions {
  /** The HTTP status answered (4xx or 5xx; default 422). */
  status?: number;
}

/**
 * A handler's business error: the caller gets `AGENT_ERROR` with this status and code,
 * never retried; except {@link HandlerError.unavailable} (503), which makes the router
 * try another instance.
 *
 * ```ts
 * throw new HandlerError("ORDER_NOT_FOUND", "no order SO-1", { status: 404 });
 * ```
 */
export class HandlerError extends Error {
  readonly code: string;
  readonly status: number;

  constructor(code: string, message: string, options: HandlerErrorOptions = {}) {
    super(message);
    this.name = new.target.name;
    this.code = code;
    const status = options.status ?? 422;
    this.status = status >= 400 && status <= 599 ? status : 500;
  }

  /** "Not now": the router retries on another instance (503 `UNAVAILABLE`). */
  static unavailable(message: string): HandlerError {
    return new HandlerError("UNAVAILABLE", message, { status: 503 });
  }

  /** The input is unusable for a reason its schema cannot say (400 `INVALID_INPUT`). */
  static invalidInput(message: string): HandlerError {
    return new HandlerError("INVALID_INPUT", message, { status: 400 });
  }
}

/**
 * "Need more input" (docs/design.md, "Multi-turn tasks"): the handler cannot answer until
 * the caller says more; `message` says what it needs. Answered 422 with the code
 * `INPUT_REQUIRED`: an A2A task goes `input-required` with `message` as its status message,
 * and the caller's next message naming the task is delivered with the conversation so far
 * (`ctx.history`). A plain `/v1/invoke` caller gets it as `AGENT_ERROR` (`details.agent_code`).
 *
 * ```ts
 * if (input.size === undefined) throw new InputRequired("Which size: S, M or L?");
 * ```
 */
export class InputRequired extends HandlerError {
  constructor(message: string) {
    super("INPUT_REQUIRED", message);
  }
}

/** What `ctx.acceptAndReport` throws on a task's delivery: answered `202 Accepted`, reported later. */
/**
 * What a preemptible handler throws when `ctx.pauseRequested` says to pause (DESIGN §9):
 * the task becomes `paused`, and its resumed delivery (on any instance) carries
 * `checkpoint` as `ctx.checkpoint`. Not an error the caller sees, and not remembered as
 * the request's answer.
 */
export class Paused extends HandlerError {
  readonly checkpoint: unknown;

  constructor(checkpoint?: unknown) {
    super("PAUSED", "paused for higher-priority work");
    this.checkpoint = checkpoint ?? null;
  }
}

export class Accepted extends HandlerError {
  constructor() {
    super("ACCEPTED", "accepted; the result is reported to the router");
    (this as { status: number }).status = 202;
  }
}
