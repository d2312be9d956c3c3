#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang, ASan + UBSan; CMake GS_FUZZ=ON in
# their own build folder) and runs each, $JOBS of them (default nproc) at
# a time: first once over its seed corpus and saved crashes
# (tests/fuzz/corpus/NAME, tests/fuzz/regressions/NAME), then fuzzing for
# SECONDS. New inputs go to a scratch corpus, not the
# repository's; a crash leaves its input under BUILD/artifacts/NAME/ and
# fails the run (copy it to tests/fuzz/regressions/NAME/ once fixed).
#
#   tests/fuzz/run.sh SECONDS [BUILD]        (make test: 4 s each; make fuzz: 60 s)
#   FUZZ_ONLY="idx http" tests/fuzz/run.sh 30  (some harnesses only)
#
# Prints one line and exits 0 when clang or its libFuzzer is missing.
set -euo pipefail

seconds=${1:-4}
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${2:-$src/build-fuzz}
jobs=${JOBS:-$(nproc)}
harnesses=${FUZZ_ONLY:-frame messages dispatch http idx checkpoint}

probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' \
  >"$probe/p.c"
if ! command -v clang >/dev/null; then
  echo "fuzz: skipped: clang is not installed (scripts/install-deps.sh installs it)"
  exit 0
fi
if ! clang -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2>/dev/null; then
  echo "fuzz: skipped: clang cannot link -fsanitize=fuzzer (libFuzzer missing)"
  exit 0
fi

CC=clang cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGS_FUZZ=ON >/dev/null
cmake --build "$build" -j "$jobs" >/dev/null

# One harness: over its seeds, then fuzzing; "ok" or "FAILED" in BUILD/fuzz-NAME.result.
fuzz_one() {
  local name=$1 bin=$build/bin/fuzz_$1 seeds=$src/tests/fuzz/corpus/$1
  local work=$build/corpus/$1 artifacts=$build/artifacts/$1 log=$build/fuzz-$1.log
  mkdir -p "$work" "$artifacts"
  # -timeout: one input taking 60 s is a hang (they take milliseconds; a
  # loaded machine can stretch that to seconds); -rss_limit_mb: a memory blow-up.
  if "$bin" -runs=0 "$seeds" "$src/tests/fuzz/regressions/$name" >"$log" 2>&1 &&
    "$bin" -max_total_time="$seconds" -timeout=60 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$artifacts/" "$work" "$seeds" >>"$log" 2>&1; then
    echo ok >"$build/fuzz-$name.result"
  else
    echo FAILED >"$build/fuzz-$name.result"
  fi
}

# JOBS harnesses at a time (each is one process on one core), so that
# make test spends SECONDS x harnesses / JOBS fuzzing, not SECONDS x harnesses.
running=0
for name in $harnesses; do
  rm -f "$build/fuzz-$name.result"
  fuzz_one "$name" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

failed=()
for name in $harnesses; do
  log=$build/fuzz-$name.log
  artifacts=$build/artifacts/$name
  if [ "$(cat "$build/fuzz-$name.result" 2>/dev/null)" = ok ]; then
    echo "fuzz: $name: $(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$') runs in ${seconds} s, no crash"
  else
    echo "fuzz: $name: FAILED (log $log, inputs in $artifacts):"
    grep -E 'ERROR|runtime error|invariant|SUMMARY|Test unit written' "$log" | head -20
    failed+=("$name")
  fi
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: ${#failed[@]} harness(es) failed: ${failed[*]}"
  exit 1
fi
