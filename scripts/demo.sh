#!/usr/bin/env bash
# The main job: until the agent lands, start a coordinator on free ports and
# show what it reports over HTTP. Usage: scripts/demo.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
bin="$build/coordinator/gradsync-coordinator"
[ -x "$bin" ] || { echo "demo: $bin not built; run 'make build'" >&2; exit 1; }

out=$(mktemp)
"$bin" --listen 127.0.0.1:0 --http 127.0.0.1:0 >"$out" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$out"' EXIT
for _ in $(seq 100); do
  [ -s "$out" ] && break
  sleep 0.05
done
line=$(head -n 1 "$out")
echo "$line"
http=${line##*http=}
rpc=${line#*rpc=}
rpc=${rpc%% *}

get() {
  echo "\$ curl http://$http$1"
  python3 - "http://$http$1" <<'PY'
import json, sys, urllib.request
body = urllib.request.urlopen(sys.argv[1]).read().decode()
try:
    print(json.dumps(json.loads(body), indent=2))
except ValueError:
    print(body, end="")
PY
}
get /healthz
get /status
echo "(agents join with: gradsync-agent --coordinator $rpc ...; see README.md)"
