// Access requests from an agent (DESIGN §2.11): at start-up an agent asks to call a
// capability `acl.yaml` does not let it call yet; an approver named under `owners:`
// decides, and once approved every router lets the calls through, with nothing restarted.

import { AgentReachError, RegistryError } from "./errors.js";
import { log } from "./log.js";
import { isObject, jsonHeaders, send, serviceAnswer, text, unreachable } from "./wire.js";

/**
 * Where an agent's access to a capability stands after `Agent.requestAccess`: `"allowed"`
 * (acl.yaml or a live grant already lets it call) or `"pending"` (filed now, or earlier and
 * not yet decided: its `id`, and who may approve).
 */
export type AccessRequest =
  | { status: "allowed" }
  | { status: "pending"; id: string; approvers: string[] };

/** Options of `Agent.requestAccess`. */
export interface AccessRequestOptions {
  /** The grant's life once approved, in seconds (absent: until revoked). */
  ttlS?: number;
}

/** `POST /v1/access-requests` on the first registry that answers (they share one etcd). */
export async function requestAccess(
  registries: string[],
  token: string,
  capability: string,
  reason: string,
  options: AccessRequestOptions = {},
): Promise<AccessRequest> {
  const body: Record<string, unknown> = { capability, reason };
  if (options.ttlS !== undefined) body["ttl_s"] = options.ttlS;
  let failure: AgentReachError = unreachable("registry", registries.join(", ") || "(none)", new Error("no registry"));
  for (const registry of registries) {
    const url = `${registry}/v1/access-requests`;
    let answer: unknown;
    try {
      const response = await send("registry", url, {
        method: "POST",
        headers: jsonHeaders(token),
        body: JSON.stringify(body),
        timeoutMs: 10_000,
      });
      answer = await serviceAnswer(response, "registry");
    } catch (caught) {
      if (caught instanceof RegistryError && caught.code === "ALREADY_ALLOWED") return { status: "allowed" };
      if (caught instanceof AgentReachError && caught.retryable) {
        failure = caught;
        continue;
      }
      throw caught;
    }
    if (!isObject(answer) || typeof answer["id"] !== "string") {
      throw new RegistryError("INVALID_ANSWER", `${url} answered without a request id`);
    }
    const approvers = Array.isArray(answer["approvers"]) ? answer["approvers"].map(text) : [];
    log.info("Access requested.", { capability, request_id: answer["id"], approvers: approvers.join(",") });
    return { status: "pending", id: answer["id"], approvers };
  }
  throw failure;
}
