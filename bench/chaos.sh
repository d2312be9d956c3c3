#!/usr/bin/env bash
# Elastic training under faults: 4-rank --world-size 2:4 jobs on CPU, each
# with a kill -9, a SIGSTOP or (as root) a node's link pulled at a random
# moment; detection, regroup, steps lost, accuracy and leftovers per trial,
# then the cost of the elastic engine's deferred SGD; see bench/chaos.py.
#
# usage: bench/chaos.sh [BUILD_DIR] [chaos.py flags, e.g. --trials 20 --seed 1 --faults kill,stop,netns]
#   BUILD_DIR  default build (built when missing)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"

build=build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then build=$1; shift; fi
bin=$(bench_build "$build" gradsync-agent gradsync-coordinator)
exec /usr/bin/python3 "$here/chaos.py" --bin "$bin" "$@"
