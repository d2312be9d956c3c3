#!/usr/bin/env bash
# Hang injection: how often and how fast the coordinator names the rank
# that holds a job up, and what the instrumentation costs; see
# bench/hang_inject.py.
#
# usage: bench/hang_inject.sh [BUILD_DIR] [hang_inject.py flags, e.g. --runs 10 --pairs 5]
#   BUILD_DIR  default build (built when missing)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"

build=build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then build=$1; shift; fi
bench_need_debs strace iproute2 # the per-step count; the slow link's netns nodes
bin=$(bench_build "$build" gradsync-agent gradsync-coordinator gradsync-run progress_cost)
exec /usr/bin/python3 "$here/hang_inject.py" --bin "$bin" "$@"
