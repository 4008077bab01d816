// The bench's SDK agent: one echo handler with zod schemas, served by `agent.run()`,
// verifying every router assertion against the router's JWKS, as in production.
import { Agent, z } from "../src/index.js";

const Payload = z.object({ text: z.string(), n: z.number() });

await new Agent({ name: "ts_agent", agentId: "bench_sdk-1" })
  .handler({ capability: process.env["BENCH_CAPABILITY"] ?? "test.echo_sdk", input: Payload, output: Payload }, (payload) => payload)
  .run();
