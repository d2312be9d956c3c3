#!/usr/bin/env bash
# Host allreduce side by side: gradsync's host backend (bench/allreduce_bench;
# by default its links between ranks on one machine are shared memory, and
# "gradsync-tcp" is the same run with GRADSYNC_HOST_SHM=0),
# Open MPI over TCP (--mca btl tcp,self), Open MPI over shared memory
# (--mca btl vader,self) and torch.distributed gloo, all float32 sum between
# processes on this machine. The implementations take turns (A B C D E,
# A B C D E, ...) for ROUNDS rounds, so that drifting background load hits
# them all alike; the table shows each one's median per size, and the busbw
# ratios ours/MPI-TCP, ours-over-TCP/MPI-TCP, ours/MPI-shm and ours/gloo,
# and at the smallest size the latency ratio ours/MPI-TCP (time; lower is
# better).
#
#   bench/allreduce_vs_mpi.sh [--ranks "2 4"] [--rounds 3] [--min 4KiB]
#       [--max 256MiB] [--time 0.3] [--build DIR] [--out DIR]
#
# BUILD (default build/) is configured if needed and allreduce_bench
# built (or brought up to date) in it. Raw CSV lines go to OUT/raw.csv (default a temp folder).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

ranks="2 4" rounds=3 min=4KiB max=256MiB time=0.3 build=build out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --min) min=$2; shift 2 ;;
    --max) max=$2; shift 2 ;;
    --time) time=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "allreduce_vs_mpi: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

bench_need_debs openmpi-bin libopenmpi-dev python3-torch
ours="$(bench_build "$build" allreduce_bench)/allreduce_bench"
[ -n "$out" ] || out=$(mktemp -d /tmp/allreduce_vs_mpi.XXXXXX)
mkdir -p "$out"
mpicc -O2 -Wall -Wextra -Werror -o "$out/mpi_allreduce" "$here/mpi_allreduce.c"

mpiflags=()
[ "$(id -u)" -eq 0 ] && mpiflags+=(--allow-run-as-root)
raw="$out/raw.csv"
: >"$raw"
sizes=(--min "$min" --max "$max" --time "$time" --csv)

for n in $ranks; do
  # mpirun pins each rank to a core when there are at least as many cores
  # as ranks, and oversubscribing needs saying; ours and gloo do the same.
  over=() bind=(--bind)
  [ "$n" -gt "$(nproc)" ] && over=(--oversubscribe) bind=()
  for ((round = 1; round <= rounds; round++)); do
    echo "allreduce_vs_mpi: $n ranks, round $round of $rounds" >&2
    "$ours" --ranks "$n" "${sizes[@]}" "${bind[@]}" >>"$raw"
    GRADSYNC_HOST_SHM=0 "$ours" --ranks "$n" "${sizes[@]}" "${bind[@]}" |
      sed 's/^gradsync,/gradsync-tcp,/' >>"$raw"
    mpirun "${mpiflags[@]}" "${over[@]}" -n "$n" --mca btl tcp,self \
      "$out/mpi_allreduce" "${sizes[@]}" --label mpi-tcp >>"$raw"
    mpirun "${mpiflags[@]}" "${over[@]}" -n "$n" --mca btl vader,self \
      "$out/mpi_allreduce" "${sizes[@]}" --label mpi-shm >>"$raw"
    OMP_NUM_THREADS=1 /usr/bin/python3 "$here/gloo_allreduce.py" --ranks "$n" "${sizes[@]}" \
      "${bind[@]}" >>"$raw"
  done
done

# One table per world size: medians per implementation and size.
/usr/bin/python3 - "$raw" <<'EOF'
import collections, statistics, sys

rows = collections.defaultdict(list)  # (ranks, impl, bytes) -> [(time_us, busbw, ok)]
for line in open(sys.argv[1]):
    f = line.strip().split(",")
    if len(f) != 7:
        continue
    impl, n, b, t, _alg, bus, ok = f
    rows[(int(n), impl, int(b))].append((float(t), float(bus), ok == "yes"))

def med(key, i):
    v = rows.get(key)
    return statistics.median(x[i] for x in v) if v else float("nan")

def human(b):
    for unit, s in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << s and b % (1 << s) == 0:
            return "%d %s" % (b >> s, unit)
    return "%d B" % b

impls = ["gradsync", "gradsync-tcp", "mpi-tcp", "mpi-shm", "gloo"]
for n in sorted({k[0] for k in rows}):
    sizes = sorted({k[2] for k in rows if k[0] == n})
    print("\n%d ranks: median time (us) and busbw (GB/s) over %d rounds" %
          (n, max(len(v) for k, v in rows.items() if k[0] == n)))
    print("| size | " + " | ".join("%s us | %s GB/s" % (i, i) for i in impls) +
          " | ours/MPI-TCP | ours-tcp/MPI-TCP | ours/MPI-shm | ours/gloo | correct |")
    print("|---:" * (1 + 2 * len(impls) + 4) + "|---|")
    for b in sizes:
        cells = []
        for i in impls:
            cells += ["%.1f" % med((n, i, b), 0), "%.2f" % med((n, i, b), 1)]
        ours, otcp, tcp, shm, gloo = (med((n, i, b), 1) for i in impls)
        ok = all(x[2] for i in impls for x in rows.get((n, i, b), []))
        print("| %s | %s | %.2f | %.2f | %.2f | %.2f | %s |" %
              (human(b), " | ".join(cells), ours / tcp, otcp / tcp, ours / shm, ours / gloo,
               "yes" if ok else "NO"))
    b0 = sizes[0]
    print("\nlatency at %s: ours %.1f us (over TCP %.1f), MPI-TCP %.1f us (ratio %.2f), "
          "MPI-shm %.1f us, gloo %.1f us" %
          (human(b0), med((n, "gradsync", b0), 0), med((n, "gradsync-tcp", b0), 0),
           med((n, "mpi-tcp", b0), 0), med((n, "gradsync", b0), 0) / med((n, "mpi-tcp", b0), 0),
           med((n, "mpi-shm", b0), 0), med((n, "gloo", b0), 0)))
EOF
echo "raw results: $raw" >&2
