#!/usr/bin/env bash
# Installs the build into a temporary prefix, builds tests/install/hello_engine.c
# there (outside the build tree) the way an outside user would, with
# `pkg-config --cflags --libs gradsync`, once against libgradsync.so and once
# statically with `pkg-config --static`, then runs the two as the two ranks of
# one job against a real coordinator on port 0: both must finish and print
# the same parameters. Every process it starts is killed on exit.
#
# usage: tests/test_install.sh BUILD_DIR COORDINATOR_BIN
set -euo pipefail

build=$(cd "$1" && pwd)
coord=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
pids=()

cleanup() {
  for p in "${pids[@]}"; do
    kill -9 "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

die() {
  echo "test_install: error: $*" >&2
  for f in "$tmp"/*.out "$tmp"/*.err; do
    [ -s "$f" ] && { echo "--- $(basename "$f")"; tail -n 20 "$f"; } >&2
  done
  exit 1
}

prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null || die "cmake --install failed"
for f in include/gradsync/engine.h lib/libgradsync.so.0 lib/libgradsync.a lib/pkgconfig/gradsync.pc; do
  [ -e "$prefix/$f" ] || die "$f is not installed"
done
[ "$(readelf -d "$prefix/lib/libgradsync.so.0" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')" = libgradsync.so.0 ] ||
  die "libgradsync.so.0 has no SONAME libgradsync.so.0"

export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
cd "$tmp"
cp "$here/install/hello_engine.c" .
cc=${CC:-cc}
# shellcheck disable=SC2046 # pkg-config's words are meant to split
"$cc" -std=c11 -Wall -Wextra -Werror -o hello_shared hello_engine.c \
  $(pkg-config --cflags --libs gradsync) -Wl,-rpath,"$prefix/lib" ||
  die "cannot build against the installed libgradsync.so: $(pkg-config --cflags --libs gradsync)"
# ldd's output is read whole first: `ldd | grep -q` under pipefail fails at
# random when grep stops reading early and ldd gets SIGPIPE.
deps=$(ldd ./hello_shared)
grep -q "$prefix/lib/libgradsync.so.0" <<<"$deps" || die "hello_shared does not load the installed libgradsync.so.0"
static_libs=$(pkg-config --static --libs gradsync | sed 's/-lgradsync\b/-l:libgradsync.a/')
# shellcheck disable=SC2046,SC2086
"$cc" -std=c11 -Wall -Wextra -Werror -o hello_static hello_engine.c \
  $(pkg-config --cflags gradsync) $static_libs ||
  die "cannot build against the installed libgradsync.a: $static_libs"
deps=$(ldd ./hello_static)
if grep -q libgradsync <<<"$deps"; then die "hello_static loads libgradsync.so"; fi

"$coord" --listen 127.0.0.1:0 --http 127.0.0.1:0 --log-level warn >coord.out 2>coord.err &
pids+=($!)
rpc=
# Up to 60 s (a loaded machine can take seconds to start it); the loop
# ends as soon as the line is there.
for _ in $(seq 600); do
  rpc=$(sed -n 's/.*rpc=\([^ ]*\).*/\1/p' coord.out | head -n 1)
  [ -n "$rpc" ] && break
  sleep 0.1
done
[ -n "$rpc" ] || die "the coordinator printed no rpc= address"

timeout 600 ./hello_shared "${rpc%:*}" "${rpc##*:}" 0 >rank0.out 2>rank0.err &
r0=$!
pids+=($r0)
timeout 600 ./hello_static "${rpc%:*}" "${rpc##*:}" 1 >rank1.out 2>rank1.err &
r1=$!
pids+=($r1)
wait "$r0" || die "rank 0 (shared) exited $?"
wait "$r1" || die "rank 1 (static) exited $?"
cat rank0.out rank1.out
p0=$(grep '^params' rank0.out) || die "rank 0 printed no params"
p1=$(grep '^params' rank1.out) || die "rank 1 printed no params"
[ "$p0" = "$p1" ] || die "the ranks disagree: '$p0' vs '$p1'"
# The fit must have converged to y = 1 x0 + 2 x1 + 3 x2 + 4 x3 + 5.
echo "$p0" | awk '{ for (i = 2; i <= 6; i++) if ($i - (i - 1) > 0.01 || (i - 1) - $i > 0.01) exit 1 }' ||
  die "the parameters did not converge: $p0"
echo "test_install: both ranks finished with $p0"
