#!/usr/bin/env bash
# Runs `make test` beside CPU hogs, as on a machine that is busy with
# something else: HOGS processes (default 2, `yes > /dev/null`) that each
# keep a core busy for as long as the suite runs. Every test must pass
# so; none may depend on being scheduled promptly. The hogs are killed
# however the run ends. Prints how long it took and the load it ran under
# (the 1-minute load average, sampled every 10 s).
#
#   scripts/test-loaded.sh [HOGS]          or: make test-loaded [HOGS=2] [JOBS=2]
#
# JOBS (from the environment, as make passes it) goes to `make test`.
set -euo pipefail

hogs=${1:-${HOGS:-2}}
cd "$(dirname "$0")/.."
samples=$(mktemp)
pids=()

stop() {
  for p in "${pids[@]}"; do
    kill "$p" 2>/dev/null || true
  done
  wait "${pids[@]}" 2>/dev/null || true
  rm -f "$samples"
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

load() { cut -d' ' -f1 /proc/loadavg; }

for _ in $(seq "$hogs"); do
  yes >/dev/null &
  pids+=($!)
done
# The sampler: killed, it takes its sleep with it.
(
  trap 'kill "$s" 2>/dev/null; exit 0' TERM
  while :; do
    sleep 10 &
    s=$!
    wait "$s"
    load >>"$samples"
  done
) &
pids+=($!)

echo "test-loaded: $hogs CPU hog(s) on $(nproc) cores; load $(load) at the start"
start=$(date +%s)
rc=0
${MAKE:-make} test ${JOBS:+JOBS=$JOBS} || rc=$?
took=$(($(date +%s) - start))
summary=$(sort -n "$samples" | awk '{ v[NR] = $1; s += $1 } END {
  if (NR) printf "1-minute load min %.1f, median %.1f, max %.1f (%d samples)", v[1], v[int((NR + 1) / 2)], v[NR], NR }')
echo "test-loaded: make test exited $rc after ${took} s ($((took / 60)) min $((took % 60)) s)" \
  "beside $hogs CPU hog(s) on $(nproc) cores; ${summary:-no load samples}"
exit "$rc"
