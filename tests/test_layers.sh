#!/usr/bin/env bash
# The build refuses a reach across the agent's layers: compiled with the
# include directories CMake gives a target, a file may include the headers
# of the layers that target links, and no internal header of another.
#
# usage: tests/test_layers.sh CC FLAGS_DIR
#   FLAGS_DIR holds <target>.dirs files, one include directory a line
#   (written by tests/CMakeLists.txt with file(GENERATE)).
set -euo pipefail

cc=$1
dirs=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0

# compiles TARGET HEADER: 0 when a file including HEADER compiles with
# TARGET's include directories.
compiles() {
  local flags=()
  while IFS= read -r d; do
    [ -n "$d" ] && flags+=("-I$d")
  done <"$dirs/$1.dirs"
  printf '#include "%s"\n' "$2" >"$tmp/reach.c"
  "$cc" -std=c11 -D_GNU_SOURCE -fsyntax-only "${flags[@]}" "$tmp/reach.c" 2>"$tmp/err"
}

may() {
  if ! compiles "$1" "$2"; then
    echo "FAIL: $1 cannot include $2:"; cat "$tmp/err"; failed=1
  fi
}

may_not() {
  if compiles "$1" "$2"; then
    echo "FAIL: $1 can include $2 (another layer's internals)"; failed=1
  elif ! grep -q "$2: No such file" "$tmp/err"; then
    echo "FAIL: $1 including $2 failed for another reason:"; cat "$tmp/err"; failed=1
  fi
}

# The trainer: the public engine header and the device API, nothing else.
may gs_trainer gradsync/engine.h
may gs_trainer device.h
for h in comm.h host_internal.h comm_shm.h client.h heartbeat.h client_internal.h backoff.h \
  engine_internal.h packs.h control.h checkpoint.h; do
  may_not gs_trainer "$h"
done
# The engine: the APIs of client, comm and device, not their internals.
for h in gradsync/engine.h comm.h client.h heartbeat.h device.h; do
  may gs_engine "$h"
done
for h in host_internal.h comm_shm.h client_internal.h backoff.h; do
  may_not gs_engine "$h"
done
# The comm layer: the device API, not the client or the engine.
may gs_comm device.h
for h in client.h engine_internal.h; do
  may_not gs_comm "$h"
done
[ "$failed" -eq 0 ] && echo "test_layers: every reach across the layers is refused"
exit "$failed"
