/**
 * Agent-Reach for TypeScript: handlers declared with zod schemas become a registered,
 * heartbeating, draining agent that verifies the router's hop assertions, calls other
 * capabilities, streams and shares session context; a `Client` for callers.
 *
 * ```ts
 * import { Agent, z } from "@agent-reach/sdk";
 *
 * const agent = new Agent({ name: "summarizer" }); // links from AGENT_REACH_* variables
 * agent.handler(
 *   { capability: "text.summarize", input: z.object({ text: z.string() }), output: z.object({ summary: z.string() }) },
 *   async ({ text }) => ({ summary: text.slice(0, 100) }),
 * );
 * await agent.run(); // registers, serves, heartbeats; SIGTERM drains and deregisters
 * ```
 */

export { z } from "zod";

export type { AccessRequest, AccessRequestOptions } from "./access.js";
export { Agent, type AgentOptions } from "./agent.js";
export { AssertionRefused, JwksFile, JwksUrl, type Assertion, type RefusalReason } from "./assertion.js";
export {
  Client,
  taskOutput,
  verifyCallback,
  type ClientOptions,
  type SessionResults,
  type TaskAccepted,
  type TaskOptions,
  type TaskStatus,
  type TaskView,
} from "./client.js";
export { ContextHandle, Contexts, type ContextView, type CreateOptions, type Patch, type Tier } from "./contexts.js";
export { Ctx, type Budget, type CtxCallOptions, type Turn } from "./ctx.js";
export {
  Accepted,
  AgentError,
  AgentReachError,
  AllRetriesExhausted,
  CapabilityNotFound,
  ConfigError,
  ContextCode,
  ContextError,
  ContextNotFound,
  DeadlineExceeded,
  Forbidden,
  HandlerDefinitionError,
  HandlerError,
  InputRequired,
  InvalidEnvelope,
  LeaseExpired,
  NoAvailableInstance,
  Overloaded,
  Paused,
  PayloadTooLarge,
  RateLimited,
  RegistrationRefused,
  RegistryCode,
  RegistryError,
  RouterCode,
  RouterError,
  SchemaMismatch,
  StreamInterrupted,
  TaskNotFound,
  TasksDisabled,
  TransportError,
  Unauthenticated,
  VersionConflict,
  VersionNotFound,
  type HandlerErrorOptions,
} from "./errors.js";
export type { Descriptor, HandlerFunction, HandlerSpec, JsonSchema, StreamingFunction, StreamingSpec } from "./handler.js";
export { CallStream } from "./sse.js";
export type { Load, LoadThresholds, Status } from "./status.js";
export type { CallOptions, CapabilityOffer, InvokeResult, Policy, Priority, StreamResult, Usage } from "./wire.js";
