/**
 * The Vercel AI SDK: every capability the caller may call, as the AI SDK's `tool()`s.
 *
 * ```ts
 * import { generateText, stepCountIs } from "ai";
 * import { Client } from "@agent-reach/sdk";
 * import { capabilityTools } from "@agent-reach/sdk/ai";
 *
 * const client = new Client({ router: "http://router:7500", token });
 * const tools = await capabilityTools(client, { only: ["order.query"] });
 * const { text } = await generateText({ model, tools, stopWhen: stepCountIs(3), prompt: "Where is SO-1?" });
 * ```
 *
 * The list is the router's for the caller's token (its MCP door's `tools/list`, filtered by
 * `acl.yaml`), each capability at its highest version with its input schema and
 * description. A tool is named after its capability with `-` for `.` (`order.query` →
 * `order-query`: providers allow only `[a-zA-Z0-9_-]` in tool names, and capability names
 * hold no `-`). A capability whose input is not an object takes its payload as the argument
 * `input`. Inside a handler, pass its `ctx`: calls carry the delivery's deadline, session,
 * context and trace. A failed call throws an `Error` whose message is `CODE: message`, which
 * the AI SDK hands back to the model as the tool's error. `ai` (>= 6) is an optional peer
 * dependency: only this entry point needs it.
 */

import { jsonSchema, tool, type JSONSchema7, type Tool } from "ai";

import type { Client } from "./client.js";
import type { Ctx } from "./ctx.js";
import { AgentReachError, RouterError } from "./errors.js";
import type { CapabilityOffer } from "./wire.js";

/** The tool name of `capability`: `.` becomes `-` (`order.query` → `order-query`). */
export function toolName(capability: string): string {
  return capability.replaceAll(".", "-");
}

export interface CapabilityToolsOptions {
  /** Only these capabilities (each must be callable, else `CAPABILITY_NOT_FOUND`). */
  only?: readonly string[];
}

/** Every capability `caller` (a `Client`, or a handler's `ctx`) may call, as tools keyed by tool name. */
export async function capabilityTools(caller: Client | Ctx, options: CapabilityToolsOptions = {}): Promise<Record<string, Tool>> {
  const offers = await caller.capabilities();
  const only = options.only === undefined ? undefined : new Set(options.only);
  if (only !== undefined) {
    const missing = [...only].filter((name) => !offers.some((offer) => offer.name === name));
    if (missing.length > 0) {
      throw new RouterError("CAPABILITY_NOT_FOUND", `not callable by this caller (or not registered): ${missing.sort().join(", ")}`);
    }
  }
  const tools: Record<string, Tool> = {};
  for (const offer of offers) {
    if (only === undefined || only.has(offer.name)) tools[toolName(offer.name)] = capabilityTool(caller, offer);
  }
  return tools;
}

function capabilityTool(caller: Client | Ctx, offer: CapabilityOffer): Tool {
  const call = async (payload: unknown): Promise<unknown> =>
    "invoke" in caller ? (await caller.invoke(offer.name, payload)).output : caller.call(offer.name, payload);
  return tool({
    description: offer.description === "" ? `Calls the Agent-Reach capability ${offer.name}.` : offer.description,
    inputSchema: jsonSchema<Record<string, unknown>>(offer.inputSchema as JSONSchema7),
    execute: async (args: Record<string, unknown>) => {
      try {
        return await call(offer.inputWrapped ? args["input"] : args);
      } catch (error) {
        if (error instanceof AgentReachError) throw new Error(`${error.code}: ${error.message}`, { cause: error });
        throw error;
      }
    },
  });
}
