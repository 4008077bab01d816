// The router's codes are DESIGN §3.8's table (as sdk/src/error.rs's `router_codes_are_the_designs`
// holds the Rust list to it), and each error class carries its code.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { AgentError, HandlerError, RouterCode, SchemaMismatch, RouterError } from "../src/index.js";
import { envelopeError } from "../src/wire.js";
import { REPO } from "./support/stack.js";

test("router codes are DESIGN §3.8's table", () => {
  const design = readFileSync(join(REPO, "docs", "design.md"), "utf8");
  const section = design.split("### 3.8 Error codes")[1]?.split("\n### ")[0] ?? "";
  const documented = section
    .split("\n")
    .filter((line) => line.startsWith("| `"))
    .map((line) => line.slice(3).split("`")[0] ?? "");
  assert.ok(documented.length >= 20, documented.join(","));
  const ours: string[] = Object.values(RouterCode);
  for (const code of documented) assert.ok(ours.includes(code), `${code} (DESIGN §3.8) is not in RouterCode`);
  for (const code of ours) {
    // INTERNAL is the router's last resort (§3.7), named below the table.
    assert.ok(code === RouterCode.INTERNAL || documented.includes(code), `${code} is not in DESIGN §3.8`);
  }
});

test("failed envelopes become the class of their code", () => {
  const mismatch = envelopeError(
    { status: "failed", request_id: "r1", error: { code: "SCHEMA_MISMATCH", message: "no", retryable: false, details: { total: 1 } } },
    422,
  );
  assert.ok(mismatch instanceof SchemaMismatch && mismatch instanceof RouterError);
  assert.equal(mismatch.code, "SCHEMA_MISMATCH");
  assert.equal(mismatch.status, 422);
  assert.equal(mismatch.requestId, "r1");
  assert.deepEqual(mismatch.details, { total: 1 });
  const agent = envelopeError({ error: { code: "AGENT_ERROR", message: "x", details: { agent_code: "NOPE", agent_status: 404 } } }, 404);
  assert.ok(agent instanceof AgentError);
  assert.equal(agent.agentCode, "NOPE");
  assert.equal(agent.agentStatus, 404);
  const unknown = envelopeError({ error: { code: "SOMETHING_NEW", message: "x", retryable: true } }, 500);
  assert.equal(unknown.constructor, RouterError);
  assert.equal(unknown.retryable, true);
});

test("handler errors keep a 4xx/5xx status", () => {
  assert.equal(new HandlerError("ORDER_NOT_FOUND", "no").status, 422);
  assert.equal(new HandlerError("GONE", "archived", { status: 410 }).status, 410);
  assert.equal(new HandlerError("WEIRD", "x", { status: 200 }).status, 500);
  assert.equal(HandlerError.unavailable("warming up").status, 503);
  assert.equal(HandlerError.invalidInput("bad").code, "INVALID_INPUT");
});
