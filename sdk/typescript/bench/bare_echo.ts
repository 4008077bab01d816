// The bench's baseline: a bare node:http echo agent doing the same work by hand (decode the
// envelope, answer {"output": payload}), registered through the registry's HTTP API with
// heartbeats; it checks no assertion and no schema.
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";

const registry = process.env["AGENT_REACH_REGISTRY"] ?? "";
const headers = { authorization: `Bearer ${process.env["AGENT_REACH_TOKEN"] ?? ""}`, "content-type": "application/json" };
const agentId = "bench_bare-1";

const server = createServer({ noDelay: true, keepAlive: true }, (request, response) => {
  const chunks: Buffer[] = [];
  request.on("data", (chunk: Buffer) => chunks.push(chunk));
  request.on("end", () => {
    const envelope = JSON.parse(Buffer.concat(chunks).toString()) as { payload: unknown };
    const body = JSON.stringify({ output: envelope.payload });
    response.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
    response.end(body);
  });
});
server.keepAliveTimeout = 65_000;
server.listen(0, "127.0.0.1", () => {
  void (async () => {
    const { port } = server.address() as AddressInfo;
    const registration = {
      agent_id: agentId,
      name: "ts_agent",
      endpoint: `http://127.0.0.1:${port}/invoke`,
      ttl_s: 15,
      status: "ready",
      capabilities: [{ name: process.env["BENCH_CAPABILITY"] ?? "test.echo_bare", version: "1.0.0" }],
    };
    const answer = await (await fetch(`${registry}/v1/agents`, { method: "POST", headers, body: JSON.stringify(registration) })).text();
    const lease = /"lease_id"\s*:\s*(-?\d+)/.exec(answer)?.[1] ?? "0";
    setInterval(() => {
      void fetch(`${registry}/v1/agents/${agentId}/heartbeat`, { method: "PUT", headers, body: `{"lease_id":${lease}}` });
    }, 5000);
  })();
});
process.once("SIGTERM", () => {
  void fetch(`${registry}/v1/agents/${agentId}`, { method: "DELETE", headers }).finally(() => process.exit(0));
});
