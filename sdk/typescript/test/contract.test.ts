// The SDK contract (sdk/contract/driver.py, the same for every SDK) with the TypeScript
// SDK's conformance agent (contract_agent.ts): the driver starts the real stack and two
// agents, and checks every behaviour; it runs with the Python of the repository's .venv
// (scripts/setup.sh makes it), or $AGENT_REACH_PYTHON.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { REPO } from "./support/stack.js";

test("the TypeScript SDK keeps the SDK contract", () => {
  const python = process.env["AGENT_REACH_PYTHON"] ?? join(REPO, ".venv/bin/python");
  assert.ok(existsSync(python), `${python} is missing: run scripts/setup.sh (or set AGENT_REACH_PYTHON)`);
  const agent = join(REPO, "sdk/typescript/build/test/contract_agent.js");
  const run = spawnSync(python, [join(REPO, "sdk/contract/driver.py"), "--", process.execPath, agent], {
    encoding: "utf8",
    timeout: 240_000,
  });
  assert.equal(run.status, 0, `the contract driver failed:\n${run.stdout}\n${run.stderr}`);
  assert.match(run.stdout, /contract: every behaviour held/);
});
