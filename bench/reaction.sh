#!/usr/bin/env bash
# How soon gradsync reacts (a rank killed, a signal, a refused join, a
# failing command, a hostile client): the bounds tests no longer assert,
# measured; see bench/reaction.py.
#
# usage: bench/reaction.sh [BUILD_DIR] [reaction.py flags, e.g. --runs 5 --rows kill,signal]
#   BUILD_DIR  default build (built when missing)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"

build=build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then build=$1; shift; fi
bin=$(bench_build "$build" gradsync-agent gradsync-coordinator gradsync-run)
exec /usr/bin/python3 "$here/reaction.py" --bin "$bin" "$@"
