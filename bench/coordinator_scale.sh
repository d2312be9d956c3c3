#!/usr/bin/env bash
# Coordinator scale benchmark: measures, in one run and
# against a fresh coordinator each time,
#
#   1. rendezvous of 10,000 simulated ranks in one job (first connect to the
#      last Join answer), then the coordinator's CPU while all of them
#      heartbeat at 1 Hz (utime + stime from /proc/PID/stat);
#   2. GET /status requests/s under wrk (2 threads, 100 connections) while
#      1,000 ranks heartbeat;
#
# each --runs times, and prints a table of medians against the targets.
# The simulated ranks come from bench/coord_load.c (one libuv loop, one TCP
# connection per rank, the real wire protocol).
#
# usage: bench/coordinator_scale.sh [BUILD_DIR] [--runs N] [--ranks N]
#            [--status-ranks N] [--hb-seconds S] [--wrk-seconds S]
#
# BUILD_DIR (default: build) is configured and built if needed; missing
# Debian packages (the build's, and wrk) are installed. Run as root or with
# sudo on Debian 12. Every process it starts is stopped on exit.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=build
runs=3
ranks=10000
status_ranks=1000
hb_seconds=15
wrk_seconds=10

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "coordinator_scale: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=${2:?}; shift 2 ;;
    --ranks) ranks=${2:?}; shift 2 ;;
    --status-ranks) status_ranks=${2:?}; shift 2 ;;
    --hb-seconds) hb_seconds=${2:?}; shift 2 ;;
    --wrk-seconds) wrk_seconds=${2:?}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) die "unknown option $1 (try --help)" ;;
    *) build=$1; shift ;;
  esac
done
for v in runs ranks status_ranks hb_seconds wrk_seconds; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--${v//_/-} must be a positive integer"
done
case "$build" in /*) ;; *) build="$root/$build" ;; esac

# --- set-up: packages, build ----------------------------------------------
. "$root/bench/common.sh"
bench_need_debs wrk
bin=$(bench_build "$build" gradsync-coordinator coord_load)
coord_bin="$bin/gradsync-coordinator"
load_bin="$bin/coord_load"
[ -x "$coord_bin" ] && [ -x "$load_bin" ] || die "no binaries in $bin"

# --- processes we start, and their clean-up --------------------------------
work=$(mktemp -d /tmp/coordinator_scale.XXXXXX)
coord_pid="" load_pid=""
# Stops a child we started and still hold (by its pid), and reaps it.
reap() {
  [ -n "$1" ] || return 0
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
cleanup() {
  reap "$load_pid"
  reap "$coord_pid"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts a coordinator on free ports; sets coord_pid, rpc_addr, http_addr.
start_coordinator() {
  local out="$work/coord.out" i
  : >"$out"
  "$coord_bin" --listen 127.0.0.1:0 --http 127.0.0.1:0 >"$out" 2>"$work/coord.log" &
  coord_pid=$!
  for i in $(seq 100); do
    grep -q "listening" "$out" && break
    kill -0 "$coord_pid" 2>/dev/null || die "coordinator exited: $(tail -3 "$work/coord.log")"
    sleep 0.05
  done
  rpc_addr=$(sed -n 's/.* rpc=\([^ ]*\).*/\1/p' "$out")
  http_addr=$(sed -n 's/.* http=\([^ ]*\).*/\1/p' "$out")
  [ -n "$rpc_addr" ] && [ -n "$http_addr" ] || die "coordinator printed no address"
}

stop_coordinator() {
  reap "$coord_pid"
  coord_pid=""
}

# The value of key=VALUE in a coord_load result line.
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

# --- scenario 1: rendezvous, then heartbeats -------------------------------
rdv=() cpu=()
for run in $(seq "$runs"); do
  start_coordinator
  line=$("$load_bin" --coordinator "$rpc_addr" --ranks "$ranks" --warmup 2s \
    --duration "${hb_seconds}s" --coord-pid "$coord_pid" 2>"$work/load.log" | grep "result") \
    || die "coord_load failed (run $run): $(tail -3 "$work/load.log")"
  stop_coordinator
  [ "$(field errors "$line")" = 0 ] || die "coord_load reported errors: $line"
  rdv+=("$(field rendezvous_s "$line")")
  cpu+=("$(field coord_cpu_pct "$line")")
  echo "run $run: $ranks ranks: rendezvous $(field rendezvous_s "$line") s," \
    "$(field hb_per_s "$line") heartbeats/s over $(field window_s "$line") s," \
    "coordinator CPU $(field coord_cpu_pct "$line")% (user $(field coord_user_pct "$line")," \
    "system $(field coord_sys_pct "$line"), $(field coord_wakeups_per_s "$line") wake-ups/s)," \
    "heartbeat p99 $(field hb_p99_ms "$line") ms"
done

# --- scenario 2: GET /status under wrk while ranks heartbeat ---------------
rps=()
for run in $(seq "$runs"); do
  start_coordinator
  "$load_bin" --coordinator "$rpc_addr" --ranks "$status_ranks" --warmup 0s \
    --duration "$((wrk_seconds + 4))s" >"$work/load.out" 2>"$work/load.log" &
  load_pid=$!
  for i in $(seq 200); do
    grep -q "joined" "$work/load.out" && break
    kill -0 "$load_pid" 2>/dev/null || die "coord_load exited: $(tail -3 "$work/load.log")"
    sleep 0.05
  done
  sleep 1
  summary_bytes=$(python3 -c "import urllib.request,sys; print(len(urllib.request.urlopen(sys.argv[1]).read()))" "http://$http_addr/status")
  full_bytes=$(python3 -c "import urllib.request,sys; print(len(urllib.request.urlopen(sys.argv[1]).read()))" "http://$http_addr/status?ranks=1")
  wrk_out=$(wrk -t2 -c100 -d"${wrk_seconds}s" "http://$http_addr/status")
  wait "$load_pid" || die "coord_load failed during wrk (run $run): $(tail -3 "$work/load.log")"
  load_pid=""
  stop_coordinator
  grep -q "Non-2xx" <<<"$wrk_out" && die "wrk saw error responses: $wrk_out"
  r=$(awk '/Requests\/sec/ {printf "%.0f", $2}' <<<"$wrk_out")
  [ -n "$r" ] || die "no result from wrk: $wrk_out"
  rps+=("$r")
  line=$(grep result "$work/load.out")
  echo "run $run: GET /status $r req/s with $status_ranks ranks heartbeating" \
    "(heartbeat p99 $(field hb_p99_ms "$line") ms, errors $(field hb_errors "$line"));" \
    "/status $summary_bytes bytes, /status?ranks=1 $full_bytes bytes"
done

# --- the table --------------------------------------------------------------
# verdict VALUE TARGET lt|ge: "3.9x under" / "MISSED (1.2x over)" ...
verdict() {
  awk -v v="$1" -v t="$2" -v op="$3" 'BEGIN {
    if (op == "lt") { if (v < t) printf "met, %.2fx under", t / v; else printf "MISSED, %.2fx over", v / t }
    else { if (v >= t) printf "met, %.2fx over", v / t; else printf "MISSED, %.2fx under", t / v } }'
}
m_rdv=$(median "${rdv[@]}")
m_cpu=$(median "${cpu[@]}")
m_rps=$(median "${rps[@]}")
echo
echo "gradsync coordinator scale: median of $runs runs ($(nproc) CPUs, $(uname -r))"
printf '%-62s %-10s %-24s %-10s %s\n' "measure" "median" "runs" "target" "vs target"
printf '%-62s %-10s %-24s %-10s %s\n' "rendezvous, $ranks ranks in one job" "$m_rdv s" \
  "${rdv[*]}" "< 2 s" "$(verdict "$m_rdv" 2 lt)"
printf '%-62s %-10s %-24s %-10s %s\n' "coordinator CPU, $ranks ranks heartbeating at 1 Hz" \
  "$m_cpu %" "${cpu[*]}" "< 10 %" "$(verdict "$m_cpu" 10 lt)"
printf '%-62s %-10s %-24s %-10s %s\n' \
  "GET /status req/s (wrk -t2 -c100), $status_ranks ranks heartbeating" "$m_rps" "${rps[*]}" \
  ">= 20000" "$(verdict "$m_rps" 20000 ge)"
echo "reference (published, not measured here): PyTorch TCPStore, libuv backend:" \
  "about 2 s to start 4,000 ranks, about 100 s at 96,000"
