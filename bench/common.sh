# Sourced by the bench/*.sh entry points: Debian packages and the build.

# Installs the Debian packages given (and the project's own) that are
# missing; quiet otherwise.
bench_need_debs() {
  "$(dirname "${BASH_SOURCE[0]}")/../scripts/install-deps.sh" "$@" >&2
}

# Configures BUILD (relative to the repository root) when it has no cache,
# installs the project's packages, and builds the targets named (quick when
# they are up to date). Prints the absolute path of BUILD/bin.
bench_build() {
  local repo build
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  build=$1; shift
  case "$build" in /*) ;; *) build="$repo/$build" ;; esac
  "$repo/scripts/install-deps.sh" >&2
  [ -f "$build/CMakeCache.txt" ] ||
    cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" -j "$(nproc)" --target "$@" >/dev/null
  echo "$build/bin"
}
