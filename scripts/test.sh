#!/usr/bin/env bash
# The README's second command: install what tests need, then run every check
# and every test. CI (.ci/run) runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --all-targets --locked
# --all-targets leaves out documentation examples; they are tests too.
cargo test --workspace --doc --locked
