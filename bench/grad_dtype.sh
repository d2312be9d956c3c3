#!/usr/bin/env bash
# 16-bit gradients on the wire (--grad-dtype) against fp32: speed and
# accuracy at 2 ranks; see bench/grad_dtype.py.
#
# usage: bench/grad_dtype.sh [BUILD_DIR] [grad_dtype.py flags, e.g. --pairs 5 --no-accuracy]
#   BUILD_DIR  default build (built when missing)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"

build=build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then build=$1; shift; fi
bench_need_debs libopenblas0-pthread dataset-fashion-mnist
bin=$(bench_build "$build" gradsync-run gradsync-agent gradsync-coordinator)
exec /usr/bin/python3 "$here/grad_dtype.py" --bin "$bin" "$@"
