#!/usr/bin/env bash
# The chaos run (issue 23, point 7; docs/chaos.md): builds the `agent-reach` binary
# and the chaos driver (dev profile: the run measures losses, not speed), then runs
# every fault under steady load and prints the table. Arguments go to the driver:
#   scripts/chaos.sh                      # every fault (about 3 minutes)
#   scripts/chaos.sh --smoke              # five faults, short phases (scripts/test.sh runs this)
#   scripts/chaos.sh --only router-kill   # one fault; --help lists the options
# Exits non-zero when an accepted task was lost.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --locked -p agent-reach-cli -p agent-reach-benches --bin agent-reach --bin chaos
exec "${CARGO_TARGET_DIR:-target}/debug/chaos" "$@"
