#!/usr/bin/env bash
# Runs one fuzz target (fuzz/, docs/fuzzing.md) under libFuzzer, through
# cargo-fuzz, for RUNS executions (default 1,000,000), starting from the seed
# corpus in fuzz/corpus/TARGET and every past crash in fuzz/regressions/TARGET.
#
#   scripts/fuzz.sh TARGET [RUNS] [LIBFUZZER_FLAGS...]
#   scripts/fuzz.sh list
#
# The corpus it grows goes to fuzz/work/TARGET (kept between runs, not
# committed); a crash is written to fuzz/artifacts/TARGET/ and the run stops
# with its input, which becomes a regression test (docs/fuzzing.md says how).
# FUZZ_SANITIZER=none|address (default none: safe Rust; `address` adds
# AddressSanitizer for the unsafe code of dependencies, at about half the speed).
set -euo pipefail
cd "$(dirname "$0")/.."

targets=(front_door invoke_envelope registration acl token assertion console_seal workflow)
if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  echo "targets: ${targets[*]}"
  exit 2
fi
if [ "$1" = "list" ]; then
  printf '%s\n' "${targets[@]}"
  exit 0
fi
target="$1"
runs="${2:-1000000}"
shift $(($# >= 2 ? 2 : 1))
known=""
for name in "${targets[@]}"; do
  [ "$name" = "$target" ] && known=1
done
if [ -z "$known" ]; then
  echo "fuzz: unknown target \`$target\` (one of: ${targets[*]})" >&2
  exit 2
fi

# cargo-fuzz, pinned (scripts/setup.sh does not install it: the test suite's
# smoke replays the corpus without it).
cargo_fuzz_version="0.13.2"
if ! cargo fuzz --version 2>/dev/null | grep -q "$cargo_fuzz_version"; then
  echo "fuzz: installing cargo-fuzz $cargo_fuzz_version"
  cargo install cargo-fuzz --version "$cargo_fuzz_version" --locked
fi

# libFuzzer's coverage instrumentation is passed as -C flags, which stable
# rustc takes, so `-s none` needs nothing else. A sanitizer is still a -Z
# flag, which only a nightly compiler takes: RUSTC_BOOTSTRAP=1 lets this
# machine's stable toolchain accept it (no nightly toolchain can be fetched
# here). It is set only then, since it changes every crate's build.
sanitizer="${FUZZ_SANITIZER:-none}"
if [ "$sanitizer" != "none" ]; then
  export RUSTC_BOOTSTRAP=1
fi
# The workspace's release profile links the services with fat LTO; a fuzz
# binary gains nothing from it and would spend minutes linking each target.
export CARGO_PROFILE_RELEASE_LTO=false

work="fuzz/work/$target"
mkdir -p "$work" "fuzz/artifacts/$target"
seeds=("fuzz/corpus/$target")
[ -d "fuzz/regressions/$target" ] && seeds+=("fuzz/regressions/$target")

# -timeout: an input taking 10 s is a hang, reported as a crash.
# -max_len: inputs up to 8 KiB (heads, bodies and files bigger than that add
# nothing the parsers do not see in smaller ones).
# cargo-fuzz's default build: optimised, with debug assertions and overflow
# checks on (an overflow is a crash here, not a silent wrap).
exec cargo fuzz run -s "$sanitizer" --features libfuzzer "$target" "$work" "${seeds[@]}" -- \
  -runs="$runs" -timeout=10 -max_len=8192 -rss_limit_mb=4096 -print_final_stats=1 "$@"
