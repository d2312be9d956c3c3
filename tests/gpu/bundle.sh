#!/usr/bin/env bash
# Packs an already-built CUDA build of gradsync into a self-contained folder
# (and a tarball of it) that runs on the lent GPU machine, which has the NVIDIA
# driver, CUDA runtime, cuBLAS and NCCL (in PyTorch's wheels) but none of our
# other libraries (libuv, cJSON, http-parser, OpenBLAS, ...).
#
# usage: tests/gpu/bundle.sh [--allow-cpu] [--baseline DIR] [BUILD_DIR] [OUT_DIR]
#   BUILD_DIR  a finished build (default: build at the repository root)
#   OUT_DIR    where the bundle goes (default: BUILD_DIR/gpu-bundle); emptied
#   --allow-cpu  accept an agent built without CUDA (tests this script only)
#   --baseline DIR  an earlier CUDA build's bin/ folder: its gradsync-run,
#               -agent and -coordinator go to bin-before/, which run.sh's
#               benchmark then measures beside this build
#
# Layout of OUT_DIR:
#   bin/        gradsync-agent, gradsync-run, gradsync-coordinator, test_kernels,
#               test_nccl, test_nccl_ranks, nccl_busbw (when built), run.sh;
#               rpath set to $ORIGIN/../lib
#   lib/        every shared library they need except the ones every Linux has
#               (glibc, libgcc_s, libstdc++) and the CUDA ones the GPU machine has
#   tests/gpu/  tests/gpu/*.py, run.sh and one_gpu_ranks.sh, as in the
#               repository, and the tests/checkpoints.py, agentlib.py and
#               testlib.py they import
#   bench/      bench/gpu_*.py, torch_mlp.py, torch_vs_ddp.py, torch_frontend.py and
#               benchlib.py, as in the repository
#   examples/torch/  the PyTorch examples (fashion_cnn.py, char_transformer.py)
#   python/     the gradsync Python package (gradsync._engine on the stable ABI)
#   MANIFEST.txt
# and OUT_DIR.tar.gz beside it. On the GPU machine: tar xzf the tarball, then
# bash gpu-bundle/bin/run.sh (see tests/gpu/run.sh).
set -euo pipefail

LIMIT_BYTES=$((64 * 1024 * 1024))
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

die() { echo "bundle: error: $*" >&2; exit 1; }
note() { echo "bundle: $*"; }

allow_cpu=0
baseline=""
pos=()
while [ $# -gt 0 ]; do
  a=$1
  shift
  case "$a" in
    --allow-cpu) allow_cpu=1 ;;
    --baseline) baseline=${1:?--baseline needs a bin folder}; shift ;;
    -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $a" ;;
    *) pos+=("$a") ;;
  esac
done
[ ${#pos[@]} -le 2 ] || die "too many arguments (usage: bundle.sh [--allow-cpu] [--baseline DIR] [BUILD_DIR] [OUT_DIR])"
build=${pos[0]:-$repo/build}
out=${pos[1]:-$build/gpu-bundle}

# --- the build must exist and be a CUDA one ---------------------------------
agent="$build/bin/gradsync-agent"
[ -x "$agent" ] || die "$agent not found: run \`make build\` on a machine with nvcc (CUDA 13) first"
version=$("$agent" --version 2>&1 | head -n 1) || die "$agent --version failed: $version"
if [[ ${version,,} != *cuda* ]]; then
  if [ "$allow_cpu" -eq 1 ]; then
    note "warning: '$version' has no CUDA device; bundling anyway (--allow-cpu)"
  else
    die "'$version' mentions no cuda: this is a CPU-only build. Run \`make build\` on a machine with nvcc (CUDA 13) so the agent gets --device cuda, then bundle again"
  fi
fi
[[ ${version,,} == *nccl* ]] || note "warning: '$version' mentions no nccl backend"

# --- patchelf (one of scripts/install-deps.sh's packages) --------------------
# Without it we skip patching and rely on run.sh putting lib/ on
# LD_LIBRARY_PATH.
ensure_patchelf() {
  command -v patchelf >/dev/null 2>&1 && return 0
  "$repo/scripts/install-deps.sh" >&2 || return 1
  command -v patchelf >/dev/null 2>&1
}
have_patchelf=1
ensure_patchelf || { have_patchelf=0; note "warning: no patchelf (scripts/install-deps.sh could not install it): binaries keep their rpath; run.sh's LD_LIBRARY_PATH must find lib/"; }

# --- fresh output folder -----------------------------------------------------
case "$(cd "$(dirname "$out")" 2>/dev/null && pwd)/$(basename "$out")" in
  /|"$repo"|"$build"|"$HOME") die "refusing to use $out as OUT_DIR" ;;
esac
# Only ever delete an empty folder or an earlier bundle.
if [ -d "$out" ] && [ -n "$(ls -A "$out")" ] && [ ! -f "$out/MANIFEST.txt" ]; then
  die "$out exists, is not empty and holds no MANIFEST.txt: not a bundle, not deleting it"
fi
rm -rf "$out" "$out.tar.gz"
mkdir -p "$out/bin" "$out/lib" "$out/tests/gpu" "$out/bench"
out=$(cd "$out" && pwd)

# --- binaries ----------------------------------------------------------------
bins=()
for b in gradsync-agent gradsync-run gradsync-coordinator; do
  [ -x "$build/bin/$b" ] || die "$build/bin/$b not found: is the build complete?"
  cp -L "$build/bin/$b" "$out/bin/$b"
  bins+=("$out/bin/$b")
done
if [ -n "$baseline" ]; then
  mkdir -p "$out/bin-before"
  for b in gradsync-agent gradsync-run gradsync-coordinator; do
    [ -x "$baseline/$b" ] || die "--baseline $baseline: no $b there"
    cp -L "$baseline/$b" "$out/bin-before/$b"
    bins+=("$out/bin-before/$b")
  done
fi
for t in test_kernels test_nccl test_nccl_ranks nccl_busbw; do
  src=""
  for cand in "$build/tests/$t" "$build/bin/$t"; do
    if [ -x "$cand" ]; then src=$cand; break; fi
  done
  if [ -n "$src" ]; then
    cp -L "$src" "$out/bin/$t"
    bins+=("$out/bin/$t")
  else
    note "warning: no $t in $build/tests or $build/bin; run.sh will SKIP it"
  fi
done

# --- scripts -----------------------------------------------------------------
shopt -s nullglob
for f in "$repo"/tests/gpu/*.py "$repo"/tests/gpu/run.sh "$repo"/tests/gpu/one_gpu_ranks.sh; do
  cp "$f" "$out/tests/gpu/"
done
# tests/gpu/*.py import helpers from tests/ (checkpoints.py, agentlib.py,
# testlib.py, and the PyTorch front end's test_torch.py and torch_worker.py).
for f in checkpoints.py agentlib.py testlib.py test_torch.py torch_worker.py; do
  if [ -f "$repo/tests/$f" ]; then cp "$repo/tests/$f" "$out/tests/"; fi
done
# The Python package (the stable ABI: any CPython from 3.11 imports it).
if [ -d "$build/python/gradsync" ]; then
  mkdir -p "$out/python"
  cp -rL "$build/python/gradsync" "$out/python/"
  rm -rf "$out/python/gradsync/__pycache__"
fi
cp "$repo/tests/gpu/run.sh" "$out/bin/run.sh"
for f in "$repo"/bench/gpu_*.py "$repo"/bench/torch_mlp.py "$repo"/bench/benchlib.py \
         "$repo"/bench/torch_vs_ddp.py "$repo"/bench/torch_frontend.py; do cp "$f" "$out/bench/"; done
# The examples bench/torch_frontend.py and test_gpu_torch.py's cnn case train.
mkdir -p "$out/examples/torch"
cp "$repo"/examples/torch/*.py "$out/examples/torch/"
shopt -u nullglob
chmod +x "$out/bin/run.sh" "$out/tests/gpu/run.sh" "$out/tests/gpu/one_gpu_ranks.sh"
[ -e "$out/tests/gpu/test_gpu_agent.py" ] || note "warning: no tests/gpu/test_gpu_agent.py yet; run.sh will SKIP its cases"

# --- shared libraries --------------------------------------------------------
# What every Linux (and the GPU machine) has: glibc's parts, the loader, the
# GCC runtime. Bundling them would break on a newer glibc.
is_system_lib() {
  case "$1" in
    linux-vdso.so*|linux-gate.so*|ld-linux*|/lib*/ld-linux*|libc.so*|libm.so*|libmvec.so*| \
    libpthread.so*|libdl.so*|librt.so*|libutil.so*|libresolv.so*|libanl.so*|libnss_*| \
    libBrokenLocale.so*|libthread_db.so*|libgcc_s.so*|libstdc++.so*) return 0 ;;
  esac
  return 1
}
# What the GPU machine supplies from its driver and PyTorch's nvidia wheels;
# ours would have to match its driver, so never bundle them.
is_cuda_lib() {
  case "$1" in
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*|libnvrtc*.so*| \
    libnvJitLink.so*|libcufft*.so*|libcurand.so*|libcusolver*.so*|libcusparse*.so*| \
    libcupti.so*|libnvToolsExt.so*|libnvidia-*.so*|libnvperf*.so*) return 0 ;;
  esac
  return 1
}

declare -A seen=()
missing=()
for b in "${bins[@]}"; do
  lddout=$(ldd "$b" 2>&1) || die "ldd $b failed: $lddout"
  # Lines: "name => /path (0x..)", "name => not found", "/lib64/ld-linux.. (0x..)".
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    is_system_lib "$name" && continue
    is_cuda_lib "$name" && continue
    if [ "$path" = "not" ]; then missing+=("$(basename "$b"): $name"); continue; fi
    if [ -n "${seen[$name]:-}" ]; then continue; fi
    seen[$name]=1
    # cp -L follows the symlink chain (e.g. Debian's alternatives for
    # libopenblas.so.0) and stores the real file under the name ldd asked for.
    cp -L "$path" "$out/lib/$name"
    chmod 0755 "$out/lib/$name"
  done <<<"$lddout"
done
[ ${#missing[@]} -eq 0 ] || die "libraries not found on this machine: ${missing[*]}"

if [ "$have_patchelf" -eq 1 ]; then
  # DT_RPATH (not RUNPATH) so the libraries' own dependencies (libopenblas ->
  # libgfortran) are also looked up in lib/.
  for b in "${bins[@]}"; do
    # shellcheck disable=SC2016 # $ORIGIN is for the loader, not the shell
    patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$b" || die "patchelf failed on $b"
  done
fi

# --- manifest, size, tarball -------------------------------------------------
describe=$(git -C "$repo" describe --always --dirty --tags 2>/dev/null || echo unknown)
{
  echo "gradsync GPU bundle"
  echo "date:     $(date -u '+%Y-%m-%dT%H:%M:%SZ')"
  echo "host:     $(uname -n) ($(uname -m))"
  echo "git:      $describe"
  echo "agent:    $version"
  echo "build:    $(cd "$build" && pwd)"
  # shellcheck disable=SC2016 # $ORIGIN is for the loader, not the shell
  echo "rpath:    $([ "$have_patchelf" -eq 1 ] && echo '$ORIGIN/../lib' || echo 'unchanged (no patchelf)')"
  echo
  echo "files (bytes  path):"
  (cd "$out" && find . -type f ! -name MANIFEST.txt -printf '%s  %P\n' | sort -k2)
} >"$out/MANIFEST.txt"

total=$(du -sb "$out" | cut -f1)
note "bundle $out: $total bytes ($(awk -v b="$total" 'BEGIN{printf "%.1f", b/1048576}') MiB) in $(find "$out" -type f | wc -l) files"
[ "$total" -le "$LIMIT_BYTES" ] || die "bundle is $total bytes, over the 64 MiB the device tool carries"

tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
tsize=$(stat -c %s "$out.tar.gz")
note "tarball $out.tar.gz: $tsize bytes ($(awk -v b="$tsize" 'BEGIN{printf "%.1f", b/1048576}') MiB)"
note "on the GPU machine: tar xzf $(basename "$out").tar.gz && bash $(basename "$out")/bin/run.sh [BUNDLE_DIR] [REPORT_DIR] [--data DIR]"
