#!/usr/bin/env bash
# The README's second command: install what tests need, then run every check
# and every test, Rust then Python. CI (.ci/run) runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

log="$(mktemp)"
pylog="$(mktemp)"
trap 'rm -f "$log" "$pylog"' EXIT
cargo test --workspace --all-targets --locked 2>&1 | tee "$log"
# --all-targets leaves out documentation examples; they are tests too.
cargo test --workspace --doc --locked 2>&1 | tee -a "$log"

# The Python SDK: lint, strict types, then pytest against real etcd, Redis and the
# agent-reach and example-agent binaries, which `cargo test` above built (cargo builds a
# package's binaries for its integration tests) and the tests find in the target directory.
venv="$PWD/.venv/bin"
(cd sdk/python && "$venv/ruff" check . ../../benches/python && "$venv/ruff" format --check . ../../benches/python && "$venv/mypy")
set +e
(cd sdk/python && "$venv/python" -m pytest -q -p no:cacheprovider) 2>&1 | tee "$pylog"
pytest_status=${PIPESTATUS[0]}
set -e

# One closing line for the whole run (cargo prints one per test binary, pytest one).
summary="$(awk '/^test result:/ { passed += $4; failed += $6 } END { print passed + 0, failed + 0 }' "$log")"
pytest_line="$(grep -E '^(=+ )?[0-9]+ (passed|failed|error)' "$pylog" | tail -n 1 || true)"
count() { printf '%s\n' "$pytest_line" | grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' || echo 0; }
py_passed="$(count passed)"
py_failed=$(( $(count failed) + $(count 'errors?') ))
read -r rust_passed rust_failed <<< "$summary"
if [ "$pytest_status" -ne 0 ] && [ "$py_failed" -eq 0 ]; then
  py_failed=1  # pytest failed without a count (a crash, or no test collected: exit 5)
fi
echo "$(( rust_passed + py_passed )) passed, $(( rust_failed + py_failed )) failed"
exit "$pytest_status"
