// The small pure parts: request-id memory's bounds, load thresholds, the SSE reader.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Dedup } from "../src/dedup.js";
import { serverEvents } from "../src/sse.js";
import { thresholdsAt } from "../src/status.js";
import { newRequestId } from "../src/wire.js";

test("request-id memory keeps the newest ids within its capacity, a 200 answer as it was given", () => {
  const dedup = new Dedup(3, 60_000);
  for (const id of ["a", "b", "c", "d"]) dedup.set("tester", id, { status: 200, body: `{"output":"${id}"}`, code: "OK" });
  assert.equal(dedup.get("tester", "a"), undefined, "the oldest id is forgotten beyond the capacity");
  assert.deepEqual(dedup.get("tester", "d"), { status: 200, body: '{"output":"d"}', code: "OK" });
  assert.equal(dedup.get("someone_else", "d"), undefined, "another caller's id is another request");
  const refused = { status: 422, body: '{"error":{"code":"NO"}}', code: "NO" };
  dedup.set("tester", "e", refused);
  assert.deepEqual(dedup.get("tester", "e"), refused);
  const aged = new Dedup(10, 0);
  aged.set("tester", "x", refused);
  aged.set("tester", "y", refused);
  assert.equal(aged.get("tester", "x"), undefined, "an id past its age is forgotten");
});

test("request ids are made as the router makes them: the epoch ms in 12 hex digits, then 16 random", () => {
  const before = Date.now();
  const [first, second] = [newRequestId(), newRequestId()];
  const after = Date.now();
  for (const made of [first, second]) {
    assert.match(made, /^[0-9a-f]{28}$/);
    const at = Number.parseInt(made.slice(0, 12), 16);
    assert.ok(before <= at && at <= after, made);
  }
  assert.notEqual(first.slice(12), second.slice(12));
});

test("load thresholds are the Rust SDK's", () => {
  assert.deepEqual(thresholdsAt({ busy: 0.75, overloaded: 0.95 }, 256), [192, 244]);
  assert.deepEqual(thresholdsAt({ busy: 0.5, overloaded: 1 }, 4), [2, 4]);
  assert.deepEqual(thresholdsAt({ busy: 0.07, overloaded: 0.07 }, 100), [7, 7]);
  assert.deepEqual(thresholdsAt({ busy: 0.01, overloaded: 0.01 }, 1), [1, 1]);
});

test("server-sent events are read as they complete, across chunks, comments skipped", async () => {
  const chunks = ["data: {\"a\"", ":1}\n\n: keep-alive\n\nevent: result\r\n", "data: {\"b\":2}\r\n\r\n", "data: x\ndata: y\n\n"];
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(new TextEncoder().encode(chunk));
      controller.close();
    },
  });
  const seen = [];
  for await (const event of serverEvents(body)) seen.push(event);
  assert.deepEqual(seen, [
    { event: "message", data: '{"a":1}' },
    { event: "result", data: '{"b":2}' },
    { event: "message", data: "x\ny" },
  ]);
});
