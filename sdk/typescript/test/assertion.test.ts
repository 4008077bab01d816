// Only calls the router vouched for are served (DESIGN §8, "Hop assertion"): a missing,
// malformed, forged, expired, misdirected or mismatched assertion is refused 401
// UNAUTHENTICATED with its reason, before the handler runs; the router's own pass.
import assert from "node:assert/strict";
import { generateKeyPairSync } from "node:crypto";
import { after, before, test } from "node:test";

import { z } from "../src/index.js";
import { forwarded, makeAgent, postToAgent, startAgent } from "./support/agents.js";
import { Stack } from "./support/stack.js";

let stack: Stack;
before(async () => {
  stack = await Stack.start();
});
after(async () => {
  await stack.stop();
});

test("deliveries without a valid router assertion are refused with their reason", async (t) => {
  let runs = 0;
  const agent = makeAgent(stack).handler(
    { capability: "test.echo", input: z.object({ text: z.string() }), output: z.object({ text: z.string() }) },
    (input) => {
      runs += 1;
      return input;
    },
  );
  await startAgent(t, stack, agent);
  const audience = agent.agentId;
  const forged = generateKeyPairSync("ed25519").privateKey;
  const cases: [string, Record<string, string>, Record<string, unknown>][] = [
    ["missing", {}, {}],
    ["malformed", { authorization: "Basic dGVzdGVy" }, {}],
    ["malformed", { authorization: "Bearer not.a.jwt" }, {}],
    ["unknown_key", { authorization: `Bearer ${await stack.assertion({ audience, kid: "never-published", key: forged })}` }, {}],
    ["bad_signature", { authorization: `Bearer ${await stack.assertion({ audience, key: forged })}` }, {}],
    ["wrong_audience", { authorization: `Bearer ${await stack.assertion({ audience: "someone-else" })}` }, {}],
    ["wrong_issuer", { authorization: `Bearer ${await stack.assertion({ audience, issuer: "a-stranger" })}` }, {}],
    ["expired", { authorization: `Bearer ${await stack.assertion({ audience, ttlS: -30 })}` }, {}],
    // A valid assertion with a forged envelope: another caller, another capability.
    ["source_mismatch", { authorization: `Bearer ${await stack.assertion({ audience })}` }, { source: "admin" }],
    ["capability_mismatch", { authorization: `Bearer ${await stack.assertion({ audience, capability: "test.other" })}` }, {}],
  ];
  for (const [reason, headers, fields] of cases) {
    const answer = await postToAgent(agent, forwarded("test.echo", fields), headers);
    assert.equal(answer.status, 401, `${reason}: ${JSON.stringify(answer.body)}`);
    const error = answer.body["error"] as { code: string; details: { reason: string } };
    assert.equal(error.code, "UNAUTHENTICATED");
    assert.equal(error.details.reason, reason);
  }
  assert.equal(runs, 0, "no refused delivery reached the handler");

  // The router's assertion, and one signed with its key by hand, are served.
  const signed = await postToAgent(agent, forwarded("test.echo"), { authorization: `Bearer ${await stack.assertion({ audience })}` });
  assert.equal(signed.status, 200, JSON.stringify(signed.body));
  const routed = await stack.invoke("test.echo", { text: "through the router" });
  assert.equal(routed.status, 200, JSON.stringify(routed.body));
  assert.deepEqual(routed.body["output"], { text: "through the router" });
  assert.equal(runs, 2);
});
