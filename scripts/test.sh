#!/usr/bin/env bash
# The README's second command: install what tests need, then run every check
# and every test, Rust, Python, then TypeScript. CI (.ci/run) runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cargo test --workspace --all-targets --locked 2>&1 | tee "$log"
# --all-targets leaves out documentation examples; they are tests too.
cargo test --workspace --doc --locked 2>&1 | tee -a "$log"

venv="$PWD/.venv/bin"
export PATH="$venv:$PATH"
status=0

# The deploy checks: Kubernetes manifests render and validate, the Compose
# file and the Dockerfile check out (deploy/tests/; tools in .venv, kubectl
# from the machine or .venv/bin).
ruff check deploy/tests
ruff format --check deploy/tests
mypy --strict deploy/tests
python -m pytest deploy/tests -q -p no:cacheprovider -rs 2>&1 | tee -a "$log" || status=1

# The Python SDK: lint, strict types, then pytest against real etcd, Redis and the
# agent-reach and example-agent binaries, which `cargo test` above built (cargo builds a
# package's binaries for its integration tests) and the tests find in the target directory.
(cd sdk/python && ruff check . ../contract ../../benches/python && ruff format --check . ../contract ../../benches/python && mypy)
(cd sdk/python && python -m pytest -q -p no:cacheprovider -rs) 2>&1 | tee -a "$log" || status=1

# === TypeScript SDK (sdk/typescript, @agent-reach/sdk) ===
# Lint (eslint + typescript-eslint), strict types (tsc --strict), then node's test runner
# against real etcd, Redis and the agent-reach binary `cargo test` built above, and
# `npm pack`: the package builds and holds its ESM code and its types.
(cd sdk/typescript && npm run --silent lint && npm run --silent typecheck)
(cd sdk/typescript && npm test --silent) 2>&1 | tee -a "$log" || status=1
(
  cd sdk/typescript
  packed="$(mktemp -d)"
  trap 'rm -rf "$packed"' EXIT
  npm pack --silent --pack-destination "$packed" >/dev/null
  contents="$(tar -tzf "$packed"/agent-reach-sdk-*.tgz)"
  for file in package/package.json package/README.md package/dist/index.js package/dist/index.d.ts package/dist/ai.js; do
    grep -qx "$file" <<<"$contents" || { echo "npm pack: $file missing from the package" >&2; exit 1; }
  done
  echo "npm pack: @agent-reach/sdk packs ($(grep -c . <<<"$contents") files)"
) || status=1
# === end of TypeScript SDK ===

# === Chaos smoke (scripts/chaos.sh, docs/chaos.md) ===
# Five faults (agent, registry, etcd leader, Redis primary, Redis outage) under
# steady load through real processes, about 90 s; fails when an accepted task
# was lost. The full run (eleven faults, two on a Redis Cluster) is `scripts/chaos.sh`, not part of CI.
scripts/chaos.sh --smoke 2>&1 | tee -a "$log" || status=1
# === end of chaos smoke ===

# === Bench smoke (benches/, docs/benchmarks.md#smoke-runs) ===
# Every row of the README's bench table runs its whole bench (every stack and
# comparison process: etcd, Redis, HAProxy, nginx, redis-benchmark, wrk) for a
# few seconds on tiny sizes with `--smoke`, which prints the numbers and no
# verdict: a bench that no longer starts fails here, not at its next
# measurement. The binaries are the dev-profile ones `cargo test` built above
# (benches/tests/smoke.rs has cargo build them and keeps this list true to
# the README). About a minute in all; a bench fails the run when it exits
# non-zero, outlives its bound, or leaves a process behind (each process a
# bench starts inherits the mark below).
bench_dir="${CARGO_TARGET_DIR:-target}/debug"
for smoke in "registry-bench" "router-bench" "router-bench --tls" "router-bench --tracing" \
  "router-bench --policy=adaptive" "router-bench --trail" "router-bench --chains" "routing-bench" \
  "context-bench" "protocols-bench" "tasks-bench" "tenants-bench" "workflows-bench"; do
  read -r -a command <<<"$smoke"
  mark="bench-smoke-$$-${command[0]}-$RANDOM"
  started=$SECONDS
  echo "--- bench smoke: $smoke --smoke"
  AGENT_REACH_BENCH_SMOKE="$mark" timeout --kill-after=10 120 \
    "$bench_dir/${command[0]}" "${command[@]:1}" --smoke || status=1
  left="$(grep -lsz "^AGENT_REACH_BENCH_SMOKE=$mark\$" /proc/[0-9]*/environ | cut -d/ -f3 || true)"
  if [ -n "$left" ]; then
    echo "--- bench smoke: $smoke --smoke left processes running:"
    ps -o pid=,args= -p "$(echo $left | tr ' ' ',')" || true
    kill -9 $left 2>/dev/null || true
    status=1
  fi
  echo "--- bench smoke: $smoke --smoke: $((SECONDS - started)) s"
done
# The TypeScript SDK's bench (the README's last row), on the debug build above.
started=$SECONDS
echo "--- bench smoke: typescript (npm run bench -- --smoke)"
(cd sdk/typescript && timeout --kill-after=10 180 npm run --silent bench -- --smoke) || status=1
echo "--- bench smoke: typescript: $((SECONDS - started)) s"
# === end of bench smoke ===

# === Fuzzing smoke (fuzz/, docs/fuzzing.md) ===
# The smoke is part of the workspace's tests above: fuzz/tests/corpus.rs runs
# every target on its seed corpus, every input that once crashed it and 3,000
# seeded mutations, built as a plain test (a few seconds; building the
# instrumented libFuzzer binaries takes 5-18 min on 2 cores, so CI does not).
# Here only the long-run command is checked: it must still parse.
bash -n scripts/fuzz.sh
# === end of fuzzing smoke ===

# One closing line for the whole run (cargo prints one per test binary, pytest
# one summary per suite: "38 passed, 1 skipped in 12.16s", node's runner "# pass 17"; a suite that crashed
# or collected nothing still fails the run through `status`).
awk '
  /^test result:/ { passed += $4; failed += $6 }
  # node --test (TAP): "# pass 17", "# fail 0", "# skipped 0".
  /^# pass [0-9]+$/ { passed += $3 }
  /^# fail [0-9]+$/ { failed += $3 }
  /^# skipped [0-9]+$/ { skipped += $3 }
  /[0-9]+ (passed|failed|skipped|errors?)/ && / in [0-9.]+s/ {
    for (i = 2; i <= NF; i++) {
      word = $i; gsub(/[,=]/, "", word)
      if (word ~ /^passed/) passed += $(i - 1)
      if (word ~ /^failed/ || word ~ /^error/) failed += $(i - 1)
      if (word ~ /^skipped/) skipped += $(i - 1)
    }
  }
  END { printf "%d passed, %d failed, %d skipped\n", passed, failed, skipped }
' "$log"
exit "$status"
