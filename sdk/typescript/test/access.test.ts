// `agent.requestAccess` against the real registry and router (issue 39, point 3; DESIGN
// §2.11): an agent asks to call a capability acl.yaml does not let it call; asking again
// answers the same pending request; once an owner approves it is allowed and its calls go
// through the router; bad input throws the registry's code.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { RegistryError, z } from "../src/index.js";
import { makeAgent, startAgent } from "./support/agents.js";
import { Stack, waitUntil } from "./support/stack.js";

let stack: Stack;
before(async () => {
  stack = await Stack.start();
});
after(async () => {
  await stack.stop();
});

test("an agent asks for access at start-up and is allowed once an owner approves", async (t) => {
  const agent = makeAgent(stack, { name: "asker", agentId: "asker-1" }).handler(
    { capability: "test.asked", input: z.object({ n: z.number() }), output: z.object({ n: z.number() }) },
    ({ n }) => ({ n }),
  );
  await startAgent(t, stack, agent);
  const asked = await agent.requestAccess("test.asked", "asker calls itself in tests", { ttlS: 3600 });
  if (asked.status !== "pending") assert.fail(`expected a pending request, got ${JSON.stringify(asked)}`);
  assert.deepEqual(asked.approvers, ["owner"]);
  const again = await agent.requestAccess("test.asked", "restarted");
  assert.deepEqual(again, asked, "the pending request, not a second one");
  const refused = await stack.invoke("test.asked", { n: 1 }, {}, "asker");
  assert.equal((refused.body["error"] as { code: string }).code, "FORBIDDEN");

  const approved = await fetch(`${stack.registry.url}/v1/access-requests/${asked.id}/approve`, {
    method: "POST",
    headers: { authorization: `Bearer ${stack.token("owner")}` },
  });
  assert.equal(approved.status, 200, await approved.clone().text());
  assert.equal(((await approved.json()) as { decided_by: string }).decided_by, "owner");
  assert.deepEqual(await agent.requestAccess("test.asked", "once more"), { status: "allowed" });
  await waitUntil(async () => (await stack.invoke("test.asked", { n: 2 }, {}, "asker")).status === 200, 5000, "the call allowed");

  await assert.rejects(agent.requestAccess("test.nothing", "r"), (error: unknown) => {
    assert.ok(error instanceof RegistryError);
    assert.equal(error.code, "CAPABILITY_NOT_FOUND");
    assert.equal(error.status, 404);
    assert.equal(error.field, "capability");
    return true;
  });
  await assert.rejects(agent.requestAccess("test.asked", " "), (error: unknown) => {
    assert.ok(error instanceof RegistryError);
    assert.equal(error.code, "INVALID_ACCESS_REQUEST");
    return true;
  });
});
