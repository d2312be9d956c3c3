#!/bin/sh
# The build steps every gradsync image runs, in one place so that the
# coordinator, CPU agent and CUDA agent images cannot drift apart: each
# Dockerfile differs only in its base images and the packages named here.
#
#   build.sh build-deps coordinator|agent   apt packages to compile with
#   build.sh compile coordinator|agent      configure, build, stage into /out
#   build.sh runtime [--data]               in the runtime stage: install the
#                                           packages listed in /out, make the
#                                           gradsync user, clean apt's caches
#
# The runtime stage installs exactly the packages that own the shared
# libraries the staged binaries load (found with ldd + dpkg in the build
# stage), so the images hold runtime libraries only, whatever the
# distribution calls them (Debian 12's libuv1, Ubuntu 24.04's libuv1t64).
set -eu

export DEBIAN_FRONTEND=noninteractive

apt_install() {
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  apt-get clean
  rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log
}

build_deps() {
  # The coordinator needs only its own libraries (ctest coordinator_only_build).
  set -- build-essential cmake pkg-config libuv1-dev libcjson-dev libhttp-parser-dev libssl-dev \
    nanopb libnanopb-dev protobuf-compiler python3-protobuf
  [ "$target" = agent ] && set -- "$@" zlib1g-dev libopenblas-dev
  apt_install "$@"
}

# The package owning each shared library a staged binary loads, one a line.
runtime_packages() {
  for bin in /out/bin/*; do ldd "$bin"; done |
    awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
    while read -r lib; do
      real=$(readlink -f "$lib")
      # dpkg knows a file under the path its package ships it at: /usr/lib
      # or, before the /usr merge reached dpkg's database, /lib.
      for p in "$real" "${real#/usr}" "$lib"; do
        pkg=$(dpkg-query -S "$p" 2>/dev/null | head -1 | cut -d: -f1) && [ -n "$pkg" ] && break
      done
      case "$real" in
        /usr/local/cuda*) continue ;; # the CUDA runtime base image has it
      esac
      [ -n "$pkg" ] || { echo "build.sh: no package owns $real" >&2; pkg="?"; }
      echo "$pkg"
    done | sort -u
}

compile() {
  if [ "$target" = coordinator ]; then
    flags="-DGS_BUILD_AGENT=OFF -DGS_BUILD_TESTS=OFF"
    bins="gradsync-coordinator"
  else
    flags="-DGS_BUILD_TESTS=OFF"
    # The coordinator comes along so that `gradsync-run --nproc N` (which
    # starts its own) works in the agent image too.
    bins="gradsync-agent gradsync-run gradsync-coordinator"
  fi
  # shellcheck disable=SC2086 # flags and bins are word lists
  cmake -S /src -B /build -DCMAKE_BUILD_TYPE=Release $flags
  # shellcheck disable=SC2086
  cmake --build /build -j"$(nproc)" --target $bins
  mkdir -p /out/bin
  for b in $bins; do
    install -s -m 0755 "/build/bin/$b" /out/bin/
  done
  runtime_packages >/out/runtime-packages
  if grep -qx '?' /out/runtime-packages; then exit 1; fi
  echo "build.sh: runtime packages: $(tr '\n' ' ' </out/runtime-packages)"
}

runtime() {
  # shellcheck disable=SC2046 # one package a line
  set --
  for p in $(cat /out/runtime-packages); do
    # Only what the base lacks: the CUDA base holds (apt-mark) its NCCL.
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || set -- "$@" "$p"
  done
  if [ "$data" = 1 ]; then
    apt-get update -qq
    apt-cache show dataset-fashion-mnist >/dev/null 2>&1 || {
      echo "build.sh: dataset-fashion-mnist is not in this base's archive: build without WITH_DATA=1 and mount the IDX files (agent --data DIR)" >&2
      exit 1
    }
    set -- "$@" dataset-fashion-mnist
  fi
  if [ $# -gt 0 ]; then apt_install "$@"; fi
  groupadd --system --gid 10001 gradsync
  useradd --system --uid 10001 --gid gradsync --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin gradsync
  rm -rf /usr/share/doc/* /usr/share/man/* /usr/share/info/*
}

step=${1:?usage: build.sh build-deps|compile TARGET, or build.sh runtime [--data]}
case "$step" in
  build-deps | compile)
    target=${2:?build.sh $step: name the target: coordinator or agent}
    case "$target" in coordinator | agent) ;; *)
      echo "build.sh: unknown target '$target'" >&2
      exit 2
      ;;
    esac
    ;;
esac
case "$step" in
  build-deps) build_deps ;;
  compile) compile ;;
  runtime)
    data=0
    [ "${2:-}" = --data ] && data=1
    runtime
    ;;
  *)
    echo "build.sh: unknown step '$step'" >&2
    exit 2
    ;;
esac
