#!/usr/bin/env bash
# Coordinator scale benchmark: measures, in one run and
# against a fresh coordinator each time,
#
#   1. rendezvous of 10,000 simulated ranks in one job (first connect to the
#      last Join answer), then the coordinator's CPU while all of them
#      heartbeat at 1 Hz (utime + stime from /proc/PID/stat);
#   2. GET /status requests/s under wrk (2 threads, 100 connections) while
#      1,000 ranks heartbeat;
#   3. node agents (coord_load --node-agents: one connection per node of 8
#      ranks, each node's Joins in a Batch, its heartbeats in one
#      NodeHeartbeat, answered only with news): rendezvous, CPU at
#      1 Hz and the coordinator's memory at each of --node-worlds, the
#      same over TLS (node-tls: the coordinator with --tls-cert, the node
#      agents' connections TLS, a CA made here by openssl), beside ranks
#      connected directly at each of --direct-worlds (those the open-file
#      limit allows), and GET /status under wrk while the largest node
#      world heartbeats;
#   4. a hang at the largest node world (coord_load --hang-after: one rank's
#      data loader hangs, every other rank waits in the allreduce): the time
#      from the hang until GET /jobs/NAME names that rank, and the
#      coordinator's CPU while the job is held up;
#   5. a restart at the largest node world: kill -9 of the coordinator
#      while every rank heartbeats, a new one started on the same ports,
#      and coord_load --reregister's ranks redial and re-register as agents
#      do: the time from the first lost connection until every rank's
#      re-registration was answered, whether /jobs/load is running that
#      generation, and the new coordinator's peak CPU (0.5 s windows,
#      sampled every 100 ms) meanwhile;
#
# each --runs times, and prints a table of medians against the targets.
# The simulated ranks come from bench/coord_load.c (one libuv loop, one TCP
# connection per rank or per node, the real wire protocol).
#
# usage: bench/coordinator_scale.sh [BUILD_DIR] [--runs N] [--ranks N]
#            [--status-ranks N] [--hb-seconds S] [--wrk-seconds S]
#            [--node-worlds "10000 20000 50000 100000"] [--direct-worlds "10000 20000"]
#            [--only-restart]
#            (scenarios 3 to 5 need --node-worlds; "" skips them;
#            --only-restart runs scenario 5 alone)
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

node_worlds="10000 20000 50000 100000"
direct_worlds="10000 20000"
only_restart=""

usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "coordinator_scale: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=${2:?}; shift 2 ;;
    --ranks) ranks=${2:?}; shift 2 ;;
    --status-ranks) status_ranks=${2:?}; shift 2 ;;
    --hb-seconds) hb_seconds=${2:?}; shift 2 ;;
    --wrk-seconds) wrk_seconds=${2:?}; shift 2 ;;
    --node-worlds) node_worlds=${2?}; shift 2 ;;
    --direct-worlds) direct_worlds=${2?}; shift 2 ;;
    --only-restart) only_restart=1; shift ;;
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

# Waits (up to TRIES x 50 ms) until FILE holds a line matching PATTERN;
# dies, quoting LOG, if process PID (NAME) exits first.
# usage: wait_for_line PATTERN FILE PID NAME LOG TRIES
wait_for_line() {
  local i
  for i in $(seq "$6"); do
    grep -q "$1" "$2" && return 0
    kill -0 "$3" 2>/dev/null || die "$4 exited: $(tail -3 "$5")"
    sleep 0.05
  done
}

# Starts a coordinator on free ports (with the flags given); sets
# coord_pid, rpc_addr, http_addr.
start_coordinator() {
  local out="$work/coord.out"
  : >"$out"
  "$coord_bin" --listen 127.0.0.1:0 --http 127.0.0.1:0 "$@" >"$out" 2>"$work/coord.log" &
  coord_pid=$!
  wait_for_line "listening" "$out" "$coord_pid" coordinator "$work/coord.log" 100
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

# One descriptor per connection, in coord_load and in the coordinator. A
# simulated rank holds one connection (an agent two, which the coordinator's
# cap on one job's world assumes): lift the caps, the open-file limit
# decides.
fd_limit=$(ulimit -Hn)
[ "$fd_limit" = unlimited ] && fd_limit=1048576
ulimit -n "$fd_limit"
big=(--max-world-size 200000 --max-connections 400000 --heartbeat-timeout 60s --log-level warn)

largest=""
for w in $node_worlds; do largest=$w; done

# Scenarios 1 to 4 and their table (--only-restart skips them).
if [ -z "$only_restart" ]; then

# --- scenario 1: rendezvous, then heartbeats -------------------------------
rdv=() cpu=()
for run in $(seq "$runs"); do
  start_coordinator "${big[@]}"
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

# GET /status under wrk while N simulated ranks heartbeat (coord_load's
# flags after N) against a fresh coordinator; sets rps_run (req/s) and
# load_line (coord_load's result), and with sizes=1 summary_bytes and
# full_bytes (/status and /status?ranks=1).
status_under_load() {
  local n=$1
  shift
  start_coordinator "${big[@]}"
  "$load_bin" --coordinator "$rpc_addr" --ranks "$n" "$@" --join-timeout 120s --warmup 0s \
    --duration "$((wrk_seconds + 6))s" >"$work/load.out" 2>"$work/load.log" &
  load_pid=$!
  wait_for_line "joined" "$work/load.out" "$load_pid" coord_load "$work/load.log" 2400
  sleep 1
  if [ "${sizes:-0}" = 1 ]; then
    summary_bytes=$(python3 -c "import urllib.request,sys; print(len(urllib.request.urlopen(sys.argv[1]).read()))" "http://$http_addr/status")
    full_bytes=$(python3 -c "import urllib.request,sys; print(len(urllib.request.urlopen(sys.argv[1]).read()))" "http://$http_addr/status?ranks=1")
  fi
  wrk_out=$(wrk -t2 -c100 -d"${wrk_seconds}s" "http://$http_addr/status")
  wait "$load_pid" || die "coord_load failed during wrk: $(tail -3 "$work/load.log")"
  load_pid=""
  stop_coordinator
  grep -q "Non-2xx" <<<"$wrk_out" && die "wrk saw error responses: $wrk_out"
  rps_run=$(awk '/Requests\/sec/ {printf "%.0f", $2}' <<<"$wrk_out")
  [ -n "$rps_run" ] || die "no result from wrk: $wrk_out"
  load_line=$(grep result "$work/load.out")
}

# --- scenario 2: GET /status under wrk while ranks heartbeat ---------------
rps=()
for run in $(seq "$runs"); do
  sizes=1 status_under_load "$status_ranks"
  rps+=("$rps_run")
  echo "run $run: GET /status $rps_run req/s with $status_ranks ranks heartbeating" \
    "(heartbeat p99 $(field hb_p99_ms "$load_line") ms, errors $(field hb_errors "$load_line"));" \
    "/status $summary_bytes bytes, /status?ranks=1 $full_bytes bytes"
done

# --- scenario 3: node agents against direct ranks, by world size -------------
# A CA and the coordinator's certificate for node-tls.
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -keyout "$work/ca.key" -out "$work/ca.pem" -days 2 \
  -subj "/CN=coordinator_scale CA" 2>/dev/null
openssl req "${ec[@]}" -keyout "$work/coord.key" -out "$work/coord.csr" -subj "/CN=coord" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\n' >"$work/coord.ext"
openssl x509 -req -in "$work/coord.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" \
  -CAcreateserial -out "$work/coord.pem" -days 2 -extfile "$work/coord.ext" 2>/dev/null
declare -A s_rdv s_cpu s_rss s_kb s_p99
for mode in node node-tls direct; do
  worlds=$node_worlds flag=(--node-agents) tls=()
  [ $mode = direct ] && worlds=$direct_worlds flag=()
  if [ $mode = node-tls ]; then
    flag+=(--tls-ca "$work/ca.pem")
    tls=(--tls-cert "$work/coord.pem" --tls-key "$work/coord.key")
  fi
  for w in $worlds; do
    conns=$w
    [ $mode != direct ] && conns=$(((w + 7) / 8))
    if [ $((conns + 256)) -gt "$fd_limit" ]; then
      echo "$mode, $w ranks: skipped ($conns connections, open-file limit $fd_limit)"
      continue
    fi
    r_rdv=() r_cpu=() r_rss=() r_kb=() r_p99=()
    for run in $(seq "$runs"); do
      start_coordinator "${big[@]}" "${tls[@]}"
      line=$("$load_bin" --coordinator "$rpc_addr" --ranks "$w" "${flag[@]}" --join-timeout 120s \
        --warmup 2s --duration "${hb_seconds}s" --coord-pid "$coord_pid" 2>"$work/load.log" |
        grep "result") || die "coord_load $mode $w failed (run $run): $(tail -3 "$work/load.log")"
      stop_coordinator
      [ "$(field errors "$line")" = 0 ] && [ "$(field hb_errors "$line")" = 0 ] ||
        die "coord_load reported errors: $line"
      r_rdv+=("$(field rendezvous_s "$line")")
      r_cpu+=("$(field coord_cpu_pct "$line")")
      r_rss+=("$(field coord_rss_mb "$line")")
      r_kb+=("$(field coord_rss_per_rank_kb "$line")")
      # A node's beats are answered only with news: no round trip to time.
      r_p99+=("$([ $mode = direct ] && field hb_p99_ms "$line" || echo -)")
      echo "run $run: $mode, $w ranks on $(field connections "$line") connections: rendezvous" \
        "$(field rendezvous_s "$line") s, $(field hb_per_s "$line") heartbeats/s, coordinator" \
        "CPU $(field coord_cpu_pct "$line")% (user $(field coord_user_pct "$line"), system" \
        "$(field coord_sys_pct "$line")), RSS $(field coord_rss_mb "$line") MB" \
        "($(field coord_rss_per_rank_kb "$line") KB a rank), heartbeat p99" \
        "${r_p99[-1]} ms; coord_load itself $(field load_cpu_pct "$line")% CPU"
    done
    s_rdv[$mode $w]=$(median "${r_rdv[@]}")
    s_cpu[$mode $w]=$(median "${r_cpu[@]}")
    s_rss[$mode $w]=$(median "${r_rss[@]}")
    s_kb[$mode $w]=$(median "${r_kb[@]}")
    s_p99[$mode $w]=$([ $mode = direct ] && median "${r_p99[@]}" || echo -)
  done
done

# GET /status while the largest node world heartbeats.
node_rps=() largest=""
for w in $node_worlds; do largest=$w; done
for run in $(seq "$runs"); do
  [ -n "$largest" ] || break
  status_under_load "$largest" --node-agents
  node_rps+=("$rps_run")
  echo "run $run: GET /status $rps_run req/s while $largest ranks heartbeat through node agents"
done

# --- scenario 4: a hang named at the largest node world -----------------------
# Polls /jobs/load (no rank list) every 50 ms from the moment coord_load
# says the hang began until waiting_on names the hung rank as a hang; the
# CPU window (the last 8 s) lies inside the hang.
hang_s=() hang_cpu=()
for run in $(seq "$runs"); do
  [ -n "$largest" ] || break
  start_coordinator "${big[@]}"
  "$load_bin" --coordinator "$rpc_addr" --ranks "$largest" --node-agents --join-timeout 120s \
    --hang-after 5s --warmup 9s --duration 8s --coord-pid "$coord_pid" \
    >"$work/hang.out" 2>"$work/hang.log" &
  load_pid=$!
  wait_for_line "hang rank" "$work/hang.out" "$load_pid" coord_load "$work/hang.log" 2400
  hang_line=$(grep "hang rank" "$work/hang.out") || die "coord_load never hung a rank"
  named=$(python3 - "http://$http_addr/jobs/load?ranks_limit=0" "$(field rank "$hang_line")" \
    "$(field at_unix_ms "$hang_line")" <<'PY'
import json, sys, time, urllib.request
url, rank, at_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
while time.time() * 1000 - at_ms < 60000:
    w = json.load(urllib.request.urlopen(url, timeout=30)).get("waiting_on") or {}
    if w.get("hang") and rank in w.get("ranks", []):
        print(f"{(time.time() * 1000 - at_ms) / 1000:.2f} {w['kind']}")
        sys.exit(0)
    time.sleep(0.05)
sys.exit("not named within 60 s")
PY
  ) || die "the hung rank was not named: $(tail -3 "$work/hang.log")"
  wait "$load_pid" || die "coord_load failed during the hang: $(tail -3 "$work/hang.log")"
  load_pid=""
  stop_coordinator
  line=$(grep result "$work/hang.out")
  hang_s+=("${named% *}")
  hang_cpu+=("$(field coord_cpu_pct "$line")")
  echo "run $run: $largest ranks, one rank's data loader hung: named (${named#* }) after" \
    "${named% *} s; coordinator CPU $(field coord_cpu_pct "$line")% while held up"
done

fi

# --- scenario 5: the coordinator restarts under the largest node world --------
# Samples the CPU time of process $1 every 100 ms ("seconds ticks" lines)
# until killed.
sample_cpu() {
  local hz
  hz=$(getconf CLK_TCK)
  while [ -r "/proc/$1/stat" ]; do
    awk -v t="$(date +%s.%N)" -v hz="$hz" '{ sub(/^.*\) /, ""); print t, ($12 + $13) / hz }' \
      "/proc/$1/stat" 2>/dev/null || break
    sleep 0.1
  done
}
# The peak CPU % over 0.5 s windows of a sample_cpu file (the mean when it
# spans less), and the mean.
cpu_peak() {
  awk '{ t[NR] = $1; c[NR] = $2 } END {
    mean = NR > 1 && t[NR] > t[1] ? 100 * (c[NR] - c[1]) / (t[NR] - t[1]) : 0
    j = 1; peak = -1
    for (i = 1; i <= NR; i++) {
      while (j < NR && t[j] - t[i] < 0.5) j++
      if (t[j] - t[i] >= 0.5 && 100 * (c[j] - c[i]) / (t[j] - t[i]) > peak)
        peak = 100 * (c[j] - c[i]) / (t[j] - t[i])
    }
    printf "%.0f %.0f\n", peak < 0 ? mean : peak, mean }' "$1"
}
restart_s=() restart_peak=() restart_mean=()
for run in $(seq "$runs"); do
  [ -n "$largest" ] || break
  start_coordinator "${big[@]}"
  rpc_port=${rpc_addr##*:} http_port=${http_addr##*:}
  "$load_bin" --coordinator "$rpc_addr" --ranks "$largest" --node-agents --reregister \
    --join-timeout 120s --warmup 2s --duration 0s >"$work/restart.out" 2>"$work/restart.log" &
  load_pid=$!
  wait_for_line "joined" "$work/restart.out" "$load_pid" coord_load "$work/restart.log" 2400
  sleep 3 # every rank heartbeating
  kill -9 "$coord_pid"
  wait "$coord_pid" 2>/dev/null || true
  start_coordinator "${big[@]}" --listen "127.0.0.1:$rpc_port" --http "127.0.0.1:$http_port"
  sample_cpu "$coord_pid" >"$work/restart.cpu" &
  sampler=$!
  wait_for_line "reregistered" "$work/restart.out" "$load_pid" coord_load "$work/restart.log" 1200
  kill "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
  line=$(grep "reregistered" "$work/restart.out") ||
    die "the ranks did not re-register within 60 s: $(tail -3 "$work/restart.log")"
  state=$(python3 -c 'import json, sys, urllib.request
j = json.load(urllib.request.urlopen(sys.argv[1], timeout=30))
print(j["state"], j["generation"], j["world_size"])' "http://$http_addr/jobs/load?ranks_limit=0") ||
    die "GET /jobs/load failed after the restart"
  [ "${state%% *}" = running ] || die "the job is '$state' after the restart, not running"
  kill -INT "$load_pid"
  wait "$load_pid" || die "coord_load failed after the restart: $(tail -3 "$work/restart.log")"
  load_pid=""
  stop_coordinator
  result=$(grep result "$work/restart.out")
  [ "$(field errors "$result")" = 0 ] && [ "$(field hb_errors "$result")" = 0 ] ||
    die "coord_load reported errors after the restart: $result"
  read -r peak mean < <(cpu_peak "$work/restart.cpu")
  restart_s+=("$(field after_s "$line")")
  restart_peak+=("$peak")
  restart_mean+=("$mean")
  echo "run $run: $largest ranks, coordinator killed (-9) and restarted: every rank" \
    "re-registered $(field after_s "$line") s after the first lost connection; /jobs/load" \
    "'$state' (state, generation, world); the new coordinator's CPU peak $peak %, mean $mean %" \
    "meanwhile; every rank left after (left=$(field left "$result"))"
done

# --- the table --------------------------------------------------------------
# verdict VALUE TARGET lt|ge: "3.9x under" / "MISSED (1.2x over)" ...
verdict() {
  awk -v v="$1" -v t="$2" -v op="$3" 'BEGIN {
    if (op == "lt") { if (v < t) printf "met, %.2fx under", t / v; else printf "MISSED, %.2fx over", v / t }
    else { if (v >= t) printf "met, %.2fx over", v / t; else printf "MISSED, %.2fx under", t / v } }'
}
if [ -z "$only_restart" ]; then
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
echo
echo "node agents (8 ranks a node; node-tls: their connections TLS) against ranks connected directly: medians of $runs"
printf '%-8s %-8s %-13s %-14s %-12s %-12s %s\n' "mode" "ranks" "rendezvous s" "CPU % at 1 Hz" \
  "RSS MB" "KB a rank" "heartbeat p99 ms"
for mode in node node-tls direct; do
  for w in $([ $mode = direct ] && echo "$direct_worlds" || echo "$node_worlds"); do
    [ -n "${s_rdv[$mode $w]:-}" ] || continue
    printf '%-8s %-8s %-13s %-14s %-12s %-12s %s\n' "$mode" "$w" "${s_rdv[$mode $w]}" \
      "${s_cpu[$mode $w]}" "${s_rss[$mode $w]}" "${s_kb[$mode $w]}" "${s_p99[$mode $w]}"
  done
done
if [ -n "$largest" ] && [ -n "${s_rdv[node $largest]:-}" ]; then
  m_nrps=$(median "${node_rps[@]}")
  printf '%-62s %-10s %-10s %s\n' "rendezvous, $largest ranks through node agents" \
    "${s_rdv[node $largest]} s" "< 5 s" "$(verdict "${s_rdv[node $largest]}" 5 lt)"
  printf '%-62s %-10s %-10s %s\n' "coordinator CPU, $largest ranks heartbeating at 1 Hz" \
    "${s_cpu[node $largest]} %" "< 10 %" "$(verdict "${s_cpu[node $largest]}" 10 lt)"
  printf '%-62s %-10s %-10s %s\n' "GET /status req/s, $largest ranks heartbeating" "$m_nrps" \
    ">= 20000" "$(verdict "$m_nrps" 20000 ge)"
  printf '%-62s %-10s %-10s %s\n' "a hang named, $largest ranks (from the hang to /jobs/NAME)" \
    "$(median "${hang_s[@]}") s" "< 2 s" "$(verdict "$(median "${hang_s[@]}")" 2 lt)"
  printf '%-62s %-10s %s\n' "coordinator CPU while they are held up" \
    "$(median "${hang_cpu[@]}") %" "(the stall look is O(world) then)"
fi
fi
if [ ${#restart_s[@]} -gt 0 ]; then
  printf '%-62s %-10s %-10s %s\n' \
    "restart: $largest ranks re-registered (kill -9 to the last answer)" \
    "$(median "${restart_s[@]}") s" "< 10 s" "$(verdict "$(median "${restart_s[@]}")" 10 lt)"
  printf '%-62s %-10s %s\n' "the new coordinator's CPU meanwhile: peak (0.5 s windows), mean" \
    "$(median "${restart_peak[@]}") %" "$(median "${restart_mean[@]}") % (runs: ${restart_s[*]} s)"
fi
