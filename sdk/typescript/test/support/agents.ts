// Agents started in-process against a stack, stopped after the test that started them.
import type { TestContext } from "node:test";

import { Agent, type AgentOptions } from "../../src/index.js";
import { waitUntil, type Stack } from "./stack.js";

/** An agent wired to `stack` (verifying the router's assertions with its JWKS, as in production). */
export function makeAgent(stack: Stack, options: Partial<AgentOptions> = {}): Agent {
  return new Agent({ ...stack.agentOptions(options.name), ...options });
}

/** Starts `agent` (ready unless told otherwise), waits until the router routes to it, stops it after the test. */
export async function startAgent(t: TestContext, stack: Stack, agent: Agent, ready = true): Promise<Agent> {
  await agent.start();
  t.after(() => agent.stop());
  if (ready) {
    agent.markReady();
    const capability = agent.handlers[0]?.descriptor.name ?? "";
    await waitUntil(() => stack.routable(capability, agent.agentId), 15_000, `${agent.agentId} routable`);
  }
  return agent;
}

/** POSTs an envelope straight to an agent (standing in for the router). */
export async function postToAgent(
  agent: Agent,
  envelope: Record<string, unknown>,
  headers: Record<string, string> = {},
): Promise<{ status: number; body: Record<string, unknown> }> {
  const address = agent.address;
  if (address === undefined) throw new Error("the agent is not serving");
  const response = await fetch(`http://127.0.0.1:${address.port}/invoke`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(envelope),
  });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

/** A forwarded envelope as the router writes it (DESIGN §3.5). */
export function forwarded(capability: string, fields: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    version: "1.0",
    request_id: `r-${Math.random().toString(16).slice(2)}`,
    capability,
    capability_version: "1.0.0",
    source: "tester",
    priority: "normal",
    deadline: Date.now() + 10_000,
    attempt: 1,
    payload: { text: "hello" },
    ...fields,
  };
}
