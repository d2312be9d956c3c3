#!/usr/bin/env bash
# Sharded optimizer state (--shard-optimizer) against unsharded: speed,
# state per rank and bytes per step at 2 ranks; see bench/shard_optimizer.py.
#
# usage: bench/shard_optimizer.sh [BUILD_DIR] [shard_optimizer.py flags, e.g. --pairs 5 --no-bytes]
#   BUILD_DIR  default build (built when missing)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"

build=build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then build=$1; shift; fi
bench_need_debs libopenblas0-pthread dataset-fashion-mnist
bin=$(bench_build "$build" gradsync-run gradsync-agent gradsync-coordinator)
exec /usr/bin/python3 "$here/shard_optimizer.py" --bin "$bin" "$@"
