#!/usr/bin/env bash
# The coordinator under hostile clients: a training job alone, then beside
# every abuser of issue 23 at once; its accuracy, the coordinator's peak RSS
# against --max-memory, /healthz latency and log lines; see bench/abuse_soak.py.
# Exits 1 when a promise fails.
#
# usage: bench/abuse_soak.sh [BUILD_DIR] [abuse_soak.py flags, e.g. --max-memory 256MiB --abusers jobs,logs]
#   BUILD_DIR  default build (built when missing)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"

build=build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then build=$1; shift; fi
bin=$(bench_build "$build" gradsync-agent gradsync-coordinator)
exec /usr/bin/python3 "$here/abuse_soak.py" --bin "$bin" "$@"
