#!/usr/bin/env bash
# Installs the Debian packages gradsync needs to build and test, and any
# named as arguments (what a benchmark needs beyond them). With
# --containers, also what `make test-containers` needs: podman (and
# buildah, runc), debootstrap for a base image when no registry is
# reachable, podman-compose.
# Quiet when everything is already present; needs root (or sudo) otherwise.
set -euo pipefail

extra=()
if [ "${1:-}" = "--containers" ]; then
  shift
  extra=(podman buildah runc debootstrap podman-compose slirp4netns uidmap fuse-overlayfs
    golang-github-containernetworking-plugin-dnsname)
fi

packages=(
  build-essential cmake pkg-config
  libuv1-dev libcjson-dev libhttp-parser-dev libssl-dev zlib1g-dev
  nanopb libnanopb-dev protobuf-compiler python3-protobuf
  check
  libopenblas-dev dataset-fashion-mnist fortunes
  patchelf clang-format clang
  curl openssl python3-yaml chromium
  python3-dev python3-torch python3-numpy
  iproute2 iptables
  slurm-wlm munge
  "${extra[@]}"
  "$@"
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
