// The README's TypeScript agent, as written, in 30 lines or fewer: it type-checks under
// `tsc --strict`, runs as its own process against the real stack, registers, is called
// through the router, refuses forged assertions and envelopes (401), streams, answers a
// repeated request id once with the first result, and leaves on SIGTERM.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { generateKeyPairSync } from "node:crypto";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Client } from "../src/index.js";
import { Process, REPO, Stack, waitUntil } from "./support/stack.js";

const PACKAGE = join(REPO, "sdk", "typescript");

/** The first ```ts block of the README's "Writing an agent in TypeScript". */
function readmeAgent(): string {
  const readme = readFileSync(join(REPO, "README.md"), "utf8");
  const section = readme.split("## Writing an agent in TypeScript")[1]?.split("\n## ")[0] ?? "";
  const block = /```ts\n([\s\S]*?)```/.exec(section)?.[1];
  assert.ok(block !== undefined, "the README has a TypeScript agent");
  return block;
}

let stack: Stack;
before(async () => {
  stack = await Stack.start();
});
after(async () => {
  await stack.stop();
});

test("the README's agent, as written: 30 lines or fewer, and it does what the README says", async (t) => {
  const source = readmeAgent();
  assert.ok(source.trimEnd().split("\n").length <= 30, `${source.split("\n").length} lines`);

  // Inside the package, so `@agent-reach/sdk` resolves to the built package itself (its exports).
  const directory = join(PACKAGE, "build", "readme");
  mkdirSync(directory, { recursive: true });
  writeFileSync(join(directory, "agent.ts"), source);
  const tsconfig = {
    compilerOptions: { strict: true, target: "ES2023", module: "NodeNext", moduleResolution: "NodeNext", types: ["node"], outDir: "." },
    files: ["agent.ts"],
  };
  writeFileSync(join(directory, "tsconfig.json"), JSON.stringify(tsconfig));
  execFileSync(join(PACKAGE, "node_modules", ".bin", "tsc"), ["-p", join(directory, "tsconfig.json")], { stdio: "pipe" });

  const agent = new Process([process.execPath, join(directory, "agent.js")], join(stack.directory, "readme-agent.log"), {
    ...stack.agentEnv("summarizer"),
    AGENT_REACH_LOG: "info",
  });
  t.after(() => agent.stop());
  let agentId = "";
  let endpoint = "";
  await waitUntil(async () => {
    const found = (await (await stack.registryGet("/v1/capabilities/text.summarize")).json()) as { instances: { agent_id: string; endpoint: string }[] };
    const [instance] = found.instances;
    if (instance === undefined) return false;
    agentId = instance.agent_id;
    endpoint = instance.endpoint;
    return stack.routable("text.summarize", agentId);
  }, 20_000, `the README agent routable (log: ${agent.log})`);

  const client = new Client({ router: stack.router.url, token: stack.token("tester") });
  const text = "Agent-Reach makes independently deployed agents reachable by capability";
  const summary = await client.invoke("text.summarize", { text }, { requestId: "readme-1" });
  assert.deepEqual(summary.output, { summary: text });
  assert.equal(summary.agentId, agentId);

  // A repeated request id is answered once, with the first result (not this payload's).
  const repeat = await client.invoke("text.summarize", { text: "something else entirely" }, { requestId: "readme-1" });
  assert.deepEqual(repeat.output, { summary: text });

  // Streams: each word one event, then the router's result.
  const words: string[] = [];
  const stream = client.stream<{ word: string }>("text.words", { text: "one two three" });
  for await (const item of stream) words.push(item.word);
  assert.deepEqual(words, ["one", "two", "three"]);
  assert.equal(stream.result?.events, 3);

  // Straight to the agent, without the router's assertion, or with a forged one: 401.
  const envelope = {
    version: "1.0", request_id: "forged-1", capability: "text.summarize", capability_version: "2.0.0",
    source: "tester", deadline: Date.now() + 10_000, attempt: 1, payload: { text: "let me in" },
  };
  const post = async (authorization: string | undefined, body = envelope): Promise<{ status: number; reason: string }> => {
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (authorization !== undefined) headers["authorization"] = authorization;
    const response = await fetch(endpoint, { method: "POST", headers, body: JSON.stringify(body) });
    const answer = (await response.json()) as { error?: { code: string; details?: { reason?: string } } };
    assert.equal(answer.error?.code, response.status === 401 ? "UNAUTHENTICATED" : answer.error?.code);
    return { status: response.status, reason: answer.error?.details?.reason ?? "" };
  };
  assert.deepEqual(await post(undefined), { status: 401, reason: "missing" });
  const forgedKey = generateKeyPairSync("ed25519").privateKey;
  const forged = await stack.assertion({ audience: agentId, capability: "text.summarize", key: forgedKey });
  assert.deepEqual(await post(`Bearer ${forged}`), { status: 401, reason: "bad_signature" });
  const genuine = await stack.assertion({ audience: agentId, capability: "text.summarize" });
  assert.deepEqual(await post(`Bearer ${genuine}`, { ...envelope, source: "admin" }), { status: 401, reason: "source_mismatch" });
  assert.equal((await post(`Bearer ${genuine}`, { ...envelope, request_id: "genuine-1" })).status, 200);

  // SIGTERM: draining, deregistered, and the process exits by itself.
  agent.child.kill("SIGTERM");
  assert.equal(await agent.exited(20_000), 0, agent.tail());
  const gone = await stack.registryGet(`/v1/agents/${agentId}`);
  assert.equal(gone.status, 404);
  const drained = /"message":"Draining\."[\s\S]*"message":"Deregistered\."/;
  await waitUntil(() => drained.test(readFileSync(agent.log, "utf8")), 5000, "the agent's log: drained, then deregistered");
});
