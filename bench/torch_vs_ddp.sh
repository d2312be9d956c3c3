#!/usr/bin/env bash
# gradsync.torch against PyTorch (plain at 1 rank, DDP over gloo at 2) on
# CPU, side by side; see bench/torch_vs_ddp.py.
#
# usage: bench/torch_vs_ddp.sh [BUILD_DIR] [torch_vs_ddp.py flags, e.g. --pairs 5 --rows cnn2]
#   BUILD_DIR  default build (built when missing)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"

build=build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then build=$1; shift; fi
bench_need_debs python3-torch python3-dev
bin=$(bench_build "$build" gradsync-run gradsync-agent gradsync-coordinator gs_python_engine)
exec /usr/bin/python3 "$here/torch_vs_ddp.py" --bin "$bin" --python-dir "$(dirname "$bin")/python" "$@"
