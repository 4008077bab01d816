#!/usr/bin/env bash
# The README's second command: install what tests need, then run every check
# and every test. CI (.ci/run) runs exactly this.
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

# One closing line for the whole run (cargo prints one per test binary).
awk '/^test result:/ { passed += $4; failed += $6 } END { printf "%d passed, %d failed\n", passed, failed }' "$log"
