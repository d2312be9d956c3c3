#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang, ASan + UBSan; CMake GS_FUZZ=ON in
# their own build folder) and runs each: first once over its seed corpus
# and saved crashes (tests/fuzz/corpus/NAME, tests/fuzz/regressions/NAME),
# then fuzzing for SECONDS. New inputs go to a scratch corpus, not the
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

failed=()
for name in $harnesses; do
  bin=$build/bin/fuzz_$name
  seeds=$src/tests/fuzz/corpus/$name
  work=$build/corpus/$name
  artifacts=$build/artifacts/$name
  mkdir -p "$work" "$artifacts"
  log=$build/fuzz-$name.log
  # -timeout: one input taking 60 s is a hang (they take milliseconds; a
  # loaded machine can stretch that to seconds); -rss_limit_mb: a memory blow-up.
  if "$bin" -runs=0 "$seeds" "$src/tests/fuzz/regressions/$name" >"$log" 2>&1 &&
    "$bin" -max_total_time="$seconds" -timeout=60 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$artifacts/" "$work" "$seeds" >>"$log" 2>&1; then
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
