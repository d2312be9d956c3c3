#!/usr/bin/env bash
# Runs gradsync's GPU tests and the GPU benchmark on the lent GPU machine, out
# of a bundle made by tests/gpu/bundle.sh, and writes a report.
#
# usage: run.sh [BUNDLE_DIR] [REPORT_DIR] [--data DIR] [--only LIST]
#   BUNDLE_DIR  the bundle (default: the parent of the folder this script is in,
#               i.e. the bundle when run as BUNDLE/bin/run.sh)
#   REPORT_DIR  logs and report.md (default: $OUT, else /tmp/gradsync-gpu-report)
#   --data DIR  Fashion-MNIST IDX files (default: $GS_DATA, else
#               BUNDLE/../data/fashion-mnist, BUNDLE/data/fashion-mnist,
#               /usr/share/datasets/fashion-mnist)
#   --only LIST comma-separated subset of: kernels, nccl, nccl_ranks, the cases
#               tests/gpu/test_gpu_agent.py lists (parity, nccl1, training, ...),
#               torch, waits, cnn, bench, busbw2, busbw4, ddp
# Environment: PYTHON (default: a python3 that imports torch), GS_BENCH_ARGS
# (extra arguments for bench/gpu_vs_torch.py, e.g. "--pairs 1"; with
# BUNDLE/bin-before, an earlier build the bundle carries, the bench also
# runs it as its baseline), GS_BUSBW_ARGS (for nccl_busbw, e.g.
# "--max-bytes 256MiB"), GS_DDP_ARGS (for bench/torch_vs_ddp.py).
# Exit status: 0 when nothing FAILED (SKIPs allowed), 1 otherwise; 77 (skipped,
# as ctest and automake read it) when no GPU is visible and nothing FAILED.
set -u

here=$(cd "$(dirname "$0")" && pwd)
say() { echo "run.sh: $*"; }

bundle="" report="" data="${GS_DATA:-}" only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --data) data=${2:?--data needs a folder}; shift 2 ;;
    --only) only=${2:?--only needs a list}; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) say "unknown option $1"; exit 2 ;;
    *) if [ -z "$bundle" ]; then bundle=$1; elif [ -z "$report" ]; then report=$1
       else say "too many arguments"; exit 2; fi; shift ;;
  esac
done
if [ -z "$bundle" ]; then
  # BUNDLE/bin/run.sh, else run from the repository's tests/gpu.
  for cand in "$here/.." "$here/../../build/gpu-bundle" "$here/../../build"; do
    if [ -x "$cand/bin/gradsync-agent" ]; then bundle=$cand; break; fi
  done
  bundle=${bundle:-$here/..}
fi
[ -d "$bundle" ] || { say "no bundle folder $bundle"; exit 1; }
bundle=$(cd "$bundle" && pwd)
bin="$bundle/bin"
report=${report:-${OUT:-/tmp/gradsync-gpu-report}}
mkdir -p "$report" || { say "cannot create $report"; exit 1; }
report=$(cd "$report" && pwd)
[ -x "$bin/gradsync-agent" ] || { say "$bin/gradsync-agent not found: is $bundle a bundle?"; exit 1; }

# --- python with torch -------------------------------------------------------
py=${PYTHON:-}
if [ -z "$py" ]; then
  for cand in python3 /opt/torch/.venv/bin/python3; do
    if "$cand" -c 'import torch' >/dev/null 2>&1; then py=$cand; break; fi
  done
  py=${py:-python3}
fi

# --- CUDA libraries from PyTorch's nvidia wheels, then /usr/local/cuda -------
cuda_dirs=()
add_dir() {
  local d
  for d in "${cuda_dirs[@]+"${cuda_dirs[@]}"}"; do [ "$d" = "$1" ] && return 0; done
  cuda_dirs+=("$1")
}
# PyTorch's nvidia wheels (nvidia/cu13/lib, nvidia/nccl/lib, ...); all of
# site-packages only when the nvidia package is not importable.
scan_for_cuda() {
  local root lib
  while IFS= read -r root; do
    if [ -z "$root" ] || [ ! -d "$root" ]; then continue; fi
    while IFS= read -r lib; do
      add_dir "$(dirname "$lib")"
    done < <(find "$root" -maxdepth 5 \( -name 'libcublas.so.13' -o -name 'libcublasLt.so.13' \
               -o -name 'libcudart.so.13' -o -name 'libnccl.so.2' -o -name 'libnvrtc.so.13' \
               -o -name 'libnvJitLink.so.13' \) 2>/dev/null | sort)
  done <<<"$1"
}
nvidia_roots=$("$py" -c 'import nvidia; print("\n".join(list(nvidia.__path__)))' 2>/dev/null)
scan_for_cuda "$nvidia_roots"
if [ ${#cuda_dirs[@]} -eq 0 ]; then
  site_roots=$("$py" -c 'import site, sys
print("\n".join(dict.fromkeys(site.getsitepackages() + [p for p in sys.path if p.endswith("-packages")])))' 2>/dev/null)
  scan_for_cuda "$site_roots"
fi
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && add_dir "$(cd "$d" && pwd -P)"
done
ldp=""
for d in "${cuda_dirs[@]+"${cuda_dirs[@]}"}" "$bundle/lib"; do ldp="${ldp:+$ldp:}$d"; done
export LD_LIBRARY_PATH="$ldp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

# Where a library resolves to (real file), or "not found".
find_lib() {
  local d
  for d in "${cuda_dirs[@]+"${cuda_dirs[@]}"}"; do
    [ -e "$d/$1" ] && { readlink -f "$d/$1"; return 0; }
  done
  ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n { print $NF; exit }' | grep . || echo "not found"
}
cudart=$(find_lib libcudart.so.13) cublas=$(find_lib libcublas.so.13) nccl=$(find_lib libnccl.so.2)
say "libcudart: $cudart"
say "libcublas: $cublas"
say "libnccl:   $nccl"

# --- every binary must resolve every library ---------------------------------
unresolved=""
for b in "$bin"/gradsync-agent "$bin"/gradsync-run "$bin"/gradsync-coordinator \
         "$bin"/test_kernels "$bin"/test_nccl "$bin"/test_nccl_ranks; do
  [ -x "$b" ] || continue
  nf=$(ldd "$b" 2>&1 | grep 'not found')
  [ -n "$nf" ] && unresolved="$unresolved$(basename "$b"):\n$nf\n"
done
if [ -n "$unresolved" ]; then
  say "unresolved libraries (looked in: ${cuda_dirs[*]+"${cuda_dirs[*]}"} $bundle/lib):"
  printf '%b' "$unresolved"
  exit 1
fi
version=$("$bin/gradsync-agent" --version 2>&1 | head -n 1)
say "$version"

# --- the GPU -----------------------------------------------------------------
gpu_name="unknown" gpu_driver="unknown" gpu_cuda="unknown" gpu_cc="unknown"
if command -v nvidia-smi >/dev/null 2>&1; then
  q=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  gpu_name=$(printf '%s' "$q" | cut -d, -f1 | sed 's/^ *//;s/ *$//')
  gpu_driver=$(printf '%s' "$q" | cut -d, -f2 | sed 's/^ *//;s/ *$//')
  gpu_cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
           | grep -E '^[0-9]+[.][0-9]+$' | head -n 1)
  gpu_cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)
  : "${gpu_name:=unknown}" "${gpu_driver:=unknown}" "${gpu_cc:=unknown}" "${gpu_cuda:=unknown}"
else
  say "warning: no nvidia-smi"
fi
say "GPU: $gpu_name, compute capability $gpu_cc, driver $gpu_driver, CUDA (driver) $gpu_cuda"
# What the tests themselves ask (test_gpu_agent.py): without a GPU every
# case skips, and the benchmark is skipped here rather than failed.
no_gpu=""
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  no_gpu="no CUDA device visible (nvidia-smi -L lists none)"
  say "SKIP: $no_gpu; the tests will skip and the benchmark is not run"
fi

# --- data --------------------------------------------------------------------
has_data() { [ -e "$1/train-images-idx3-ubyte.gz" ] || [ -e "$1/train-images-idx3-ubyte" ]; }
if [ -n "$data" ]; then
  has_data "$data" || say "warning: no train-images-idx3-ubyte[.gz] in $data"
else
  for cand in "$bundle/../data/fashion-mnist" "$bundle/data/fashion-mnist" \
              /usr/share/datasets/fashion-mnist; do
    if has_data "$cand"; then data=$cand; break; fi
  done
fi
[ -n "$data" ] && [ -d "$data" ] && data=$(cd "$data" && pwd)
say "data: ${data:-none found}"

# --- running and recording ---------------------------------------------------
names=() results=() notes=() secs=()
any_fail=0

wanted() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }

record() { # NAME RESULT NOTE SECONDS
  names+=("$1") results+=("$2") notes+=("$3") secs+=("$4")
  [ "$2" = FAIL ] && any_fail=1
  printf '%-4s  %-10s %6s s  %s\n' "$2" "$1" "$4" "$3"
  write_report
}

# Last non-empty line of a log, shortened, for the summary's note column.
last_line() { grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -n 1 | cut -c1-120 | tr '|' '/'; }

# run_case NAME LIMIT_SECONDS COMMAND...: exit 0 PASS, 77 SKIP, else FAIL.
run_case() {
  local name=$1 limit=$2 log="$report/$1.log" rc t0 t1 dt
  shift 2
  wanted "$name" || return 0
  say "running $name (limit ${limit}s): $*"
  t0=$(date +%s%N)
  { echo "# $*"; echo "# LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; } >"$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  dt=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
  case $rc in
    0) record "$name" PASS "" "$dt" ;;
    77) record "$name" SKIP "$(last_line "$log")" "$dt" ;;
    124|137) record "$name" FAIL "timed out after ${limit}s" "$dt" ;;
    *) record "$name" FAIL "exit $rc: $(last_line "$log")" "$dt" ;;
  esac
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
    echo "---- last lines of $log ----"; tail -n 25 "$log"; echo "----"
  fi
}

skip_case() { wanted "$1" && record "$1" SKIP "$2" 0; return 0; }
fail_case() { wanted "$1" && record "$1" FAIL "$2" 0; return 0; }

# The first of several places a script may be (bundle layout, then repository).
find_script() {
  local f
  for f in "$@"; do [ -f "$f" ] && { echo "$f"; return 0; }; done
  return 1
}

write_report() {
  local i
  {
    echo "# gradsync GPU test report"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "- host: $(uname -n) ($(uname -m), $(uname -r))"
    echo "- GPU: $gpu_name (compute capability $gpu_cc)"
    echo "- driver: $gpu_driver, CUDA version (driver): $gpu_cuda"
    echo "- CUDA runtime found: $cudart"
    echo "- cuBLAS: $cublas"
    echo "- NCCL: $nccl"
    echo "- agent: $version"
    [ -f "$bundle/MANIFEST.txt" ] && echo "- bundle: $(grep -m1 '^git:' "$bundle/MANIFEST.txt" | sed 's/^git: *//') built $(grep -m1 '^date:' "$bundle/MANIFEST.txt" | sed 's/^date: *//')"
    echo "- python: $py ($("$py" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null || echo 'no torch'))"
    echo "- data: ${data:-none found}"
    echo
    echo "## Tests"
    echo
    echo "| test | result | seconds | note |"
    echo "|---|---|---|---|"
    for i in "${!names[@]}"; do
      echo "| ${names[$i]} | ${results[$i]} | ${secs[$i]} | ${notes[$i]} |"
    done
    echo
    for md in bench.md ddp.md; do
      if [ -s "$report/$md" ]; then
        cat "$report/$md"
        echo
      fi
    done
    echo "Logs: $report/<test>.log"
  } >"$report/report.md"
}

write_report

# a, b: the CUDA unit tests; nccl_ranks starts worlds of 1 to 4 ranks on GPU 0.
for t in kernels nccl nccl_ranks; do
  tb="" limit=120
  [ "$t" = nccl_ranks ] && limit=240
  for cand in "$bin/test_$t" "$bundle/tests/test_$t"; do
    if [ -x "$cand" ]; then tb=$cand; break; fi
  done
  if [ -n "$tb" ]; then run_case "$t" "$limit" "$tb"; else skip_case "$t" "test_$t not in the bundle"; fi
done

# c: whole-process GPU agent tests (the python file is the lead's).
agent_py=$(find_script "$bundle/tests/gpu/test_gpu_agent.py" "$here/test_gpu_agent.py" \
           "$here/../tests/gpu/test_gpu_agent.py" "$bin/test_gpu_agent.py")
# The cases are the ones its docstring lists ("cases: parity, nccl1, ...").
cases="parity nccl1 training"
if [ -n "$agent_py" ]; then
  listed=$(sed -n 's/^cases: *//p' "$agent_py" | head -n 1 | tr ',' ' ')
  [ -n "$listed" ] && cases=$listed
fi
for c in $cases; do
  if [ -z "$agent_py" ]; then skip_case "$c" "tests/gpu/test_gpu_agent.py missing"
  elif [ -z "$data" ]; then fail_case "$c" "no Fashion-MNIST data (--data DIR or GS_DATA)"
  else run_case "$c" 150 "$py" "$agent_py" "$c" "$bin" "$data"; fi
done

# c2: the PyTorch front end on the GPU (its test skips, 77, without one).
torch_py=$(find_script "$bundle/tests/gpu/test_gpu_torch.py" "$here/test_gpu_torch.py")
pydir=""
for cand in "$bundle/python" "$bin/../python"; do
  if [ -d "$cand/gradsync" ]; then pydir=$(cd "$cand" && pwd); break; fi
done
if [ -n "$no_gpu" ]; then skip_case torch "$no_gpu"; skip_case waits "$no_gpu"; skip_case cnn "$no_gpu"
elif [ -z "$torch_py" ] || [ -z "$pydir" ]; then
  skip_case torch "test_gpu_torch.py or the Python package missing from the bundle"
  skip_case waits "test_gpu_torch.py or the Python package missing from the bundle"
  skip_case cnn "test_gpu_torch.py or the Python package missing from the bundle"
else
  run_case torch 300 "$py" "$torch_py" "$bin" "$pydir" equivalence
  run_case waits 240 "$py" "$torch_py" "$bin" "$pydir" waits
  run_case cnn 240 "$py" "$torch_py" "$bin" "$pydir" cnn "${data:-}"
fi

# c3: our NCCL allreduce against ncclAllReduce, 2 and 4 ranks on GPU 0.
for n in 2 4; do
  if [ -x "$bin/nccl_busbw" ]; then
    # shellcheck disable=SC2086 # GS_BUSBW_ARGS is a word list on purpose
    run_case "busbw$n" 300 "$bin/nccl_busbw" --ranks "$n" ${GS_BUSBW_ARGS:-}
  else skip_case "busbw$n" "nccl_busbw not in the bundle"; fi
done

# d: gradsync vs PyTorch on this GPU.
bench_py=$(find_script "$bundle/bench/gpu_vs_torch.py" "$here/../../bench/gpu_vs_torch.py" \
           "$here/../bench/gpu_vs_torch.py" "$bin/gpu_vs_torch.py")
if [ -n "$no_gpu" ]; then skip_case bench "$no_gpu"
elif [ -z "$bench_py" ]; then fail_case bench "bench/gpu_vs_torch.py missing from the bundle"
elif [ -z "$data" ]; then fail_case bench "no Fashion-MNIST data (--data DIR or GS_DATA)"
else
  rm -f "$report/bench.md" "$report/bench.json" "$report/ddp.md"
  baseline=()
  [ -x "$bundle/bin-before/gradsync-run" ] && baseline=(--baseline-bin "$bundle/bin-before")
  # shellcheck disable=SC2086 # GS_BENCH_ARGS is a word list on purpose
  run_case bench 420 "$py" "$bench_py" --bin "$bin" --data "$data" \
    --json "$report/bench.json" --markdown "$report/bench.md" "${baseline[@]}" ${GS_BENCH_ARGS:-}
fi

# e: the PyTorch front end against DDP, both on NCCL over the same sockets.
ddp_py=$(find_script "$bundle/bench/torch_vs_ddp.py" "$here/../../bench/torch_vs_ddp.py")
if [ -n "$no_gpu" ]; then skip_case ddp "$no_gpu"
elif [ -z "$ddp_py" ] || [ -z "$pydir" ]; then skip_case ddp "bench/torch_vs_ddp.py or the Python package missing from the bundle"
else
  # shellcheck disable=SC2086 # GS_DDP_ARGS is a word list on purpose
  run_case ddp 300 "$py" "$ddp_py" --device cuda --bin "$bin" --python-dir "$pydir" \
    --markdown "$report/ddp.md" --json "$report/ddp.json" ${GS_DDP_ARGS:-}
fi

write_report
echo
cat "$report/report.md"
if [ -n "$no_gpu" ] && [ "$any_fail" -eq 0 ]; then
  say "SKIP: $no_gpu: nothing ran on a GPU (exit 77)"
  exit 77
fi
exit "$any_fail"
