#!/usr/bin/env bash
# Training throughput and accuracy on CPU, gradsync against PyTorch (plain at
# 1 rank, DDP over gloo at 2), side by side; see bench/train_vs_ddp.py.
#
# usage: bench/train_vs_ddp.sh [BUILD_DIR] [train_vs_ddp.py flags, e.g. --pairs 5 --rows small2]
#   BUILD_DIR  default build (built when missing)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"

build=build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then build=$1; shift; fi
bench_need_debs python3-torch libopenblas0-pthread dataset-fashion-mnist
bin=$(bench_build "$build" gradsync-run gradsync-agent gradsync-coordinator)
exec /usr/bin/python3 "$here/train_vs_ddp.py" --bin "$bin" "$@"
