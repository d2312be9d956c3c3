#!/usr/bin/env bash
# The images as an operator uses them: builds the coordinator and CPU agent
# images (docker/*.Dockerfile) with podman or docker, starts the coordinator
# container, trains the demo job (Fashion-MNIST, two ranks) in two agent
# containers against it over a container network, and checks /healthz, the
# image's HEALTHCHECK, /status (the job finished, 2 ranks left) and the final
# test accuracy; then the same with docker/compose.yaml, and the README's
# "On a cluster" block as written on four network-namespace nodes (head,
# two workers, a client: tests/containers/readme_cluster.py; root only).
# Everything it starts is removed on exit, failed or not.
#
# With no registry reachable, the debian:12 base is made with debootstrap
# from this machine's Debian mirror and imported (cached as a tarball under
# $GS_CONTAINER_CACHE, default /var/cache/gradsync or
# $XDG_CACHE_HOME/gradsync, so reruns skip it).
#
# usage: tests/containers/run.sh [SOURCE_DIR]
# Exits 77 with one line saying why when no runtime here can run containers.
# GS_CONTAINER_RUNTIME=podman|docker picks one; GS_CONTAINER_EPOCHS (default
# 3, scripts/demo.sh's job: ~0.86) sets the training length;
# GS_CONTAINER_MIN_ACCURACY (default 0.80) the bar.
set -euo pipefail

src=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
epochs=${GS_CONTAINER_EPOCHS:-3}
min_accuracy=${GS_CONTAINER_MIN_ACCURACY:-0.80}
run_id="gs-ct-$$"
t0=$(date +%s)

say() { echo "containers: [$(($(date +%s) - t0))s] $*"; }
skip() {
  echo "containers: skipped: $*"
  exit 77
}
fail() {
  echo "containers: FAIL: $*" >&2
  exit 1
}

# --- the runtime ------------------------------------------------------------

rt=${GS_CONTAINER_RUNTIME:-}
if [ -z "$rt" ]; then
  for c in podman docker; do
    command -v "$c" >/dev/null && timeout 20 "$c" info >/dev/null 2>&1 && {
      rt=$c
      break
    }
  done
  [ -n "$rt" ] || skip "neither podman nor docker can reach a container engine here (install: scripts/install-deps.sh --containers)"
fi
command -v "$rt" >/dev/null || skip "$rt is not installed"
if ! timeout 20 "$rt" info >/dev/null 2>&1; then
  why=$(timeout 20 "$rt" info 2>&1 | grep -i -m1 -E 'error|cannot' || true)
  skip "$rt cannot reach its engine (${why:-$rt info fails})"
fi

# Options that each `run` needs on this machine, found by trying: podman's
# default runtime (crun) may not start containers in a sandbox without
# cgroup v2 delegation, and without CAP_SYS_RESOURCE a container cannot get
# podman's default rlimits (nofile 1048576), so they are set to this
# shell's own limits, which it may keep.
run_opts=()
build_opts=()
probe_image=""
try_run() { timeout 60 "$rt" run --rm "${run_opts[@]}" "$probe_image" true >/dev/null 2>&1; }

# --- the base image -----------------------------------------------------------

cache=${GS_CONTAINER_CACHE:-}
if [ -z "$cache" ]; then
  if [ -w /var/cache ] || [ -w /var/cache/gradsync ]; then
    cache=/var/cache/gradsync
  else
    cache=${XDG_CACHE_HOME:-$HOME/.cache}/gradsync
  fi
fi

# The first deb URI of the configured sources (one-line or deb822 form).
debian_mirror() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    awk '/^deb[ \t]/ { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }
         /^URIs:/ { print $2; exit }' "$f"
  done | grep -v -- '-security' | head -1
}

# debian:12 made locally: debootstrap's minbase from the configured mirror,
# with the host's apt settings about stale Release files (a snapshot mirror's
# are past their Valid-Until), imported as localhost/gradsync-debian:12.
make_base() {
  local tarball="$cache/debian-12-minbase.tar" mirror root
  if [ ! -s "$tarball" ]; then
    command -v debootstrap >/dev/null ||
      skip "no registry reachable and debootstrap not installed (scripts/install-deps.sh --containers)"
    mirror=$(debian_mirror)
    [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
    say "no registry reachable: making debian:12 with debootstrap from $mirror (cached in $tarball)"
    mkdir -p "$cache"
    root=$(mktemp -d "$cache/rootfs.XXXXXX")
    if ! debootstrap --variant=minbase bookworm "$root" "$mirror" >"$cache/debootstrap.log" 2>&1; then
      rm -rf "$root"
      tail -5 "$cache/debootstrap.log" >&2
      fail "debootstrap from $mirror failed (log: $cache/debootstrap.log)"
    fi
    apt-config dump | grep -E '^Acquire::Check-(Valid-Until|Date) ' >"$root/etc/apt/apt.conf.d/90gradsync-mirror" || true
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/*
    tar -C "$root" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  if ! "$rt" image inspect localhost/gradsync-debian:12 >/dev/null 2>&1; then
    "$rt" import --change 'CMD ["/bin/bash"]' "$tarball" localhost/gradsync-debian:12 >/dev/null 2>&1 ||
      fail "$rt import $tarball failed"
  fi
  base=localhost/gradsync-debian:12
  runtime_base=$base
}

base=docker.io/library/debian:12
runtime_base=docker.io/library/debian:12-slim
if "$rt" image inspect "$base" >/dev/null 2>&1 && "$rt" image inspect "$runtime_base" >/dev/null 2>&1; then
  :
elif timeout 60 "$rt" pull -q "$base" >/dev/null 2>&1 && timeout 60 "$rt" pull -q "$runtime_base" >/dev/null 2>&1; then
  :
else
  make_base
fi

# --- can this runtime run a container here? ----------------------------------

probe_image=$runtime_base
if [ "$rt" = podman ]; then
  build_opts+=(--format docker) # OCI images drop HEALTHCHECK
  if ! try_run; then
    # The lowest-privilege set that works: the runtime as configured, then
    # runc; nofile at this shell's hard limit; nproc from this shell's hard
    # limit down (how high a container may go depends on the engine's own
    # limits, not ours: 32768 here where ours is 96365).
    found=""
    for oci in "" runc; do
      [ -z "$oci" ] || command -v "$oci" >/dev/null || continue
      for nproc in "$(ulimit -Hu)" 32768 16384 4096; do
        run_opts=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit "nproc=$nproc:$nproc")
        [ -z "$oci" ] || run_opts=(--runtime "$oci" "${run_opts[@]}")
        if try_run; then
          found=1
          break 2
        fi
      done
    done
    [ -n "$found" ] || skip "podman cannot run a container here ($("$rt" run --rm "${run_opts[@]}" "$probe_image" true 2>&1 | tail -1))"
    say "podman needs ${run_opts[*]} here"
    build_opts+=("${run_opts[@]}")
  fi
else
  try_run || skip "docker cannot run a container here ($("$rt" run --rm "$probe_image" true 2>&1 | tail -1))"
fi

# --- cleanup, whatever happens -------------------------------------------------

net="$run_id-net"
containers=("$run_id-coordinator" "$run_id-agent0" "$run_id-agent1")
compose=()
tmp=$(mktemp -d)
cleanup() {
  local rc=$?
  if [ ${#compose[@]} -gt 0 ]; then
    "${compose[@]}" down >/dev/null 2>&1 || true
    # down can miss a container its restart policy is restarting.
    "$rt" ps -aq --filter "label=com.docker.compose.project=$run_id" | xargs -r "$rt" rm -f >/dev/null 2>&1 || true
  fi
  "$rt" rm -f -t 2 "${containers[@]}" >/dev/null 2>&1 || "$rt" rm -f "${containers[@]}" >/dev/null 2>&1 || true
  # podman-compose 1.0.3's down leaves the project's network.
  "$rt" network rm "$net" >/dev/null 2>&1 || true
  "$rt" network rm "${run_id}_gradsync" >/dev/null 2>&1 || true
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- build ------------------------------------------------------------------------

version=$(sed -n 's/^project(gradsync VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
revision=$(git -C "$src" describe --always --dirty 2>/dev/null || echo unknown)
build() { # NAME DOCKERFILE [ARGS...]
  local name=$1 file=$2 log
  shift 2
  log=$(mktemp)
  say "building $name ($file)"
  if ! "$rt" build "${build_opts[@]}" -f "$src/$file" -t "$name" \
    --build-arg BASE="$base" --build-arg RUNTIME_BASE="$runtime_base" \
    --build-arg VERSION="$version" --build-arg REVISION="$revision" "$@" "$src" >"$log" 2>&1; then
    tail -40 "$log" >&2
    rm -f "$log"
    fail "building $name failed"
  fi
  rm -f "$log"
  say "built $name: $("$rt" image inspect --format '{{.Size}}' "$name" | awk '{ printf "%.0f MB", $1 / 1e6 }')"
}
# Tagged per source tree: test runs from two checkouts on one machine
# do not run each other's images.
tag=test-$(printf '%s' "$src" | cksum | cut -d' ' -f1)
coordinator_image=localhost/gradsync-coordinator:$tag
agent_image=localhost/gradsync-agent:$tag
build "$coordinator_image" docker/coordinator.Dockerfile
build "$agent_image" docker/agent.Dockerfile --build-arg WITH_DATA=1

label=$("$rt" image inspect --format '{{index .Config.Labels "org.opencontainers.image.version"}}' "$coordinator_image")
[ "$label" = "$version" ] || fail "coordinator image version label is '$label', want '$version'"
user=$("$rt" image inspect --format '{{.Config.User}}' "$agent_image")
[ "$user" = gradsync ] || fail "agent image runs as '$user', want gradsync"

# --- checks shared by both runs ------------------------------------------------

token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
http=""
get() { curl -fsS --max-time 30 "http://$http$1"; }

# /healthz answers at $http (waited for up to a minute, more on a loaded
# machine; the loop ends as soon as it does).
check_healthz() {
  local health
  for _ in $(seq 300); do
    get /healthz >/dev/null 2>&1 && break
    sleep 0.2
  done
  health=$(get /healthz) || fail "/healthz does not answer at $http"
  case "$health" in *'"ok"'*) ;; *) fail "/healthz answered '$health'" ;; esac
  say "/healthz: $health"
}

# Waits for job demo to end in /status; fails unless it finished with both
# ranks. $1: a command that fails when an agent died (it prints why).
check_status() {
  local state="" st
  for _ in $(seq 600); do
    st=$(get /status 2>/dev/null) || st=""
    state=$(printf '%s' "$st" | /usr/bin/python3 -c '
import json, sys
try:
    jobs = {j["name"]: j for j in json.load(sys.stdin)["jobs"]}
except Exception:
    sys.exit(0)
j = jobs.get("demo")
if j:
    print(j["state"], j["world_size"], j["rank_summary"]["left"])
')
    case "$state" in finished* | failed* | aborted*) break ;; esac
    "$1" || fail "an agent failed"
    sleep 0.5
  done
  say "/status: job demo: state, world size, ranks left: ${state:-?}"
  case "$state" in "finished 2 2") ;; *) fail "/status shows '$state', want 'finished 2 2'" ;; esac
}

# Rank 0's summary lines and its final accuracy, from the agents' logs on stdin.
check_accuracy() {
  local logs accuracy
  logs=$(cat)
  printf '%s\n' "$logs" | grep -E 'validation|final:|timing:' | sed 's/^/    /'
  accuracy=$(printf '%s\n' "$logs" | sed -n 's/.*final: test accuracy \([0-9.]*\).*/\1/p' | tail -1)
  [ -n "$accuracy" ] || fail "no final accuracy in the agents' logs"
  awk -v a="$accuracy" -v m="$min_accuracy" 'BEGIN { exit !(a > m) }' ||
    fail "final accuracy $accuracy is not above $min_accuracy"
  say "final test accuracy $accuracy > $min_accuracy"
}

# --- 1: the images by hand: podman/docker run ------------------------------------

say "run 1: coordinator and 2 agents with $rt run"
"$rt" network create "$net" >/dev/null
# podman without systemd logs that it cannot schedule the image's
# HEALTHCHECK; the check runs below on demand instead.
"$rt" run -d "${run_opts[@]}" --name "$run_id-coordinator" --network "$net" \
  -e GRADSYNC_TOKEN="$token" -p 127.0.0.1::8080 "$coordinator_image" >"$tmp/run.log" 2>&1 ||
  { cat "$tmp/run.log" >&2; fail "the coordinator container did not start"; }
http=$("$rt" port "$run_id-coordinator" 8080 | head -1)
http=${http/0.0.0.0/127.0.0.1}
# Agents dial the coordinator by address: name resolution on a container
# network needs a DNS plugin the engine may lack (CNI without dnsname).
coordinator_ip=$("$rt" inspect --format "{{(index .NetworkSettings.Networks \"$net\").IPAddress}}" "$run_id-coordinator")
say "coordinator up: RPC $coordinator_ip:7070 on $net, HTTP at $http"
check_healthz

# The image's HEALTHCHECK as the engine runs it.
if [ "$rt" = podman ]; then
  "$rt" healthcheck run "$run_id-coordinator" || fail "the image's HEALTHCHECK fails"
  health=healthy
else
  for _ in $(seq 240); do
    health=$("$rt" inspect --format '{{.State.Health.Status}}' "$run_id-coordinator")
    [ "$health" = starting ] || break
    sleep 0.5
  done
  [ "$health" = healthy ] || fail "the image's HEALTHCHECK says '$health'"
fi
say "HEALTHCHECK: $health"

# Each agent is a node of its own (its container's host name).
for i in 0 1; do
  "$rt" run -d "${run_opts[@]}" --name "$run_id-agent$i" --hostname "node$i" --network "$net" \
    --shm-size 64m -e GRADSYNC_TOKEN="$token" -e GRADSYNC_COORDINATOR="$coordinator_ip:7070" \
    -e GRADSYNC_JOB=demo -e GRADSYNC_WORLD_SIZE=2 \
    "$agent_image" --reduce mean --epochs "$epochs" --schedule cosine --log-level warn \
    >"$tmp/run.log" 2>&1 || { cat "$tmp/run.log" >&2; fail "agent $i did not start"; }
done
say "2 agents started: the demo job, --epochs $epochs"

agents_alive() {
  local i code
  for i in 0 1; do
    [ "$("$rt" inspect --format '{{.State.Running}}' "$run_id-agent$i")" = true ] && continue
    code=$("$rt" inspect --format '{{.State.ExitCode}}' "$run_id-agent$i")
    [ "$code" = 0 ] && continue
    "$rt" logs "$run_id-agent$i" 2>&1 | tail -20 >&2
    echo "containers: agent $i exited with status $code" >&2
    return 1
  done
}
check_status agents_alive
for i in 0 1; do
  code=$("$rt" wait "$run_id-agent$i" | tail -1)
  [ "$code" = 0 ] || fail "agent $i exited with status $code"
done
{ "$rt" logs "$run_id-agent0" 2>&1; "$rt" logs "$run_id-agent1" 2>&1; } | check_accuracy
"$rt" rm -f "${containers[@]}" >/dev/null 2>&1
"$rt" network rm "$net" >/dev/null 2>&1

# --- 2: docker/compose.yaml -------------------------------------------------------

if [ "$rt" = podman ] && command -v podman-compose >/dev/null; then
  compose=(podman-compose)
elif [ "$rt" = docker ] && docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
else
  say "run 2 (compose) skipped: no ${rt}-compose here (scripts/install-deps.sh --containers)"
  say "PASS ($rt; compose not run)"
  exit 0
fi
free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
compose+=(-p "$run_id" -f "$src/docker/compose.yaml")
say "run 2: docker/compose.yaml with ${compose[0]}"
# The images just built stand in for compose's own build (which would need
# the registry's base image).
export GRADSYNC_COORDINATOR_IMAGE=$coordinator_image GRADSYNC_AGENT_IMAGE=$agent_image
# Without the token, compose refuses to start.
if env -u GRADSYNC_TOKEN "${compose[@]}" up -d >"$tmp/compose.log" 2>&1; then
  fail "compose started without GRADSYNC_TOKEN"
fi
grep -q 'set GRADSYNC_TOKEN' "$tmp/compose.log" || { tail -5 "$tmp/compose.log" >&2; fail "compose's refusal does not name GRADSYNC_TOKEN"; }
say "without GRADSYNC_TOKEN: refused ($(grep -o 'set GRADSYNC_TOKEN[^)]*)' "$tmp/compose.log" | head -1))"
export GRADSYNC_TOKEN=$token GRADSYNC_HTTP_PORT GRADSYNC_RPC_PORT
GRADSYNC_HTTP_PORT=$(free_port)
GRADSYNC_RPC_PORT=$(free_port)
# This engine's limits, where it needed explicit ones.
for o in "${run_opts[@]}"; do
  case "$o" in
    nofile=*) o=${o#nofile=} && export GRADSYNC_NOFILE=${o%:*} ;;
    nproc=*) o=${o#nproc=} && export GRADSYNC_NPROC=${o%:*} ;;
  esac
done
"${compose[@]}" up -d >"$tmp/compose.log" 2>&1 || { tail -20 "$tmp/compose.log" >&2; fail "compose up failed"; }
http=127.0.0.1:$GRADSYNC_HTTP_PORT
check_healthz
compose_alive() { [ -z "$("$rt" ps -a --filter "label=com.docker.compose.project=$run_id" --filter status=exited --format '{{.Names}} {{.Status}}' | grep -v 'Exited (0)')" ]; }
check_status compose_alive
"${compose[@]}" logs agent-0 agent-1 2>/dev/null | check_accuracy
"${compose[@]}" down >/dev/null 2>&1
compose=()

# --- run 3: the README's "On a cluster", as written, on namespace nodes -------

say "run 3: the README's 'On a cluster' block on four network-namespace nodes"
cluster_rc=0
/usr/bin/python3 "$src/tests/containers/readme_cluster.py" "$src" "$rt" "$coordinator_image" \
  "$agent_image" "${run_opts[@]}" || cluster_rc=$?
case $cluster_rc in
  0) say "PASS ($rt, ${rt} run, compose and the README's cluster)" ;;
  77) say "PASS ($rt, ${rt} run and compose; the README's cluster skipped, said above)" ;;
  *) fail "the README's 'On a cluster' block failed" ;;
esac
