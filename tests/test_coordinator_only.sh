#!/usr/bin/env bash
# The coordinator builds with nothing but its own dependencies: a fresh
# configure with -DGS_BUILD_AGENT=OFF -DGS_BUILD_TESTS=OFF, where pkg-config
# sees only libuv and libcjson (no OpenBLAS, zlib or check), builds
# gradsync-coordinator, which then answers --version. This is the build the
# coordinator image runs.
#
# usage: tests/test_coordinator_only.sh SOURCE_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir "$tmp/pc"
for m in libuv libcjson; do
  ln -s "$(pkg-config --variable pcfiledir "$m")/$m.pc" "$tmp/pc/$m.pc"
done
PKG_CONFIG_LIBDIR=$tmp/pc PKG_CONFIG_PATH= cmake -S "$src" -B "$tmp/build" \
  -DCMAKE_BUILD_TYPE=Release -DGS_BUILD_AGENT=OFF -DGS_BUILD_TESTS=OFF >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log" >&2; echo "test_coordinator_only: configure failed" >&2; exit 1; }
cmake --build "$tmp/build" -j2 --target gradsync-coordinator >"$tmp/build.log" 2>&1 ||
  { tail -30 "$tmp/build.log" >&2; echo "test_coordinator_only: build failed" >&2; exit 1; }
version=$("$tmp/build/bin/gradsync-coordinator" --version)
case "$version" in
  "gradsync-coordinator "*) echo "test_coordinator_only: built without the agent's dependencies: $version" ;;
  *) echo "test_coordinator_only: unexpected --version output: $version" >&2; exit 1 ;;
esac
