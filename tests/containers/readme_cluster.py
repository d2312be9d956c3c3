#!/usr/bin/python3
"""The README's "On a cluster" block, run as written on four nodes
(network namespaces on a private bridge, tests/cluster.py): its head-node
lines on node c (the coordinator's image, both ports published), its
each-node lines on nodes a and b (the agent image with gradsync-run as
its entrypoint, N=2, I=0 and 1), its any-machine line on node d until the
job has finished, and the dashboard fetched from node d. The job must
train to the demo's bar.

    readme_cluster.py SOURCE_DIR RUNTIME COORDINATOR_IMAGE AGENT_IMAGE [RUN_OPTION...]

`docker` in the block is RUNTIME with the run options this machine needs
(tests/containers/run.sh found them), and the images' names in it are the
images run.sh built. Exits 77 saying why without root or the namespace
tools.
"""
import json
import os
import re
import shlex
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from cluster import ADDR, Cluster, missing_tool, sh  # noqa: E402
from testlib import WAIT, wait_until  # noqa: E402

MARKER = "<!-- cluster"
LABEL = "gradsync-test=readme-cluster"  # on every container it starts: the clean-up finds them
HEADING = "## On a cluster"
BAR = 0.80


def blocks(readme):
    """The block's lines by part: the lines after "# on the head node",
    "# on each node" and "# from any machine..."."""
    lines = open(readme, encoding="utf-8").read().splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith(MARKER)), None)
    assert at is not None, f"{readme}: no '{MARKER}' marker"
    heading = next(line for line in reversed(lines[:at]) if line.startswith("## "))
    assert heading == HEADING, f"the cluster block is under '{heading}', not '{HEADING}'"
    assert lines[at + 1].startswith("```"), "the marker is not directly followed by a code block"
    end = next(i for i in range(at + 2, len(lines)) if lines[i].startswith("```"))
    parts, part = {}, None
    for line in lines[at + 2:end]:
        if line.startswith("# "):
            part = ("head" if "head node" in line else "node" if "each node" in line
                    else "any" if "any machine" in line else None)
            assert part, f"a comment naming no part: {line}"
            parts[part] = []
        elif line.strip():
            parts[part].append(line)
    assert set(parts) == {"head", "node", "any"}, parts
    return parts


def shell(runtime, images, run_opts, lines, tail=""):
    """A bash script running `lines` with `docker` as the runtime."""
    maps = " ".join(f'[{shlex.quote(k)}]={shlex.quote(v)}' for k, v in images.items())
    return f"""set -euo pipefail
declare -A image=({maps})
docker() {{
  local args=() a prev=
  for a in "$@"; do  # an image's name (not a --name value) is the image built
    if [ "$prev" = --name ]; then args+=("$a"); else args+=("${{image[$a]:-$a}}"); fi
    prev=$a
  done
  if [ "$1" = run ]; then
    {runtime} run --label {LABEL} {' '.join(shlex.quote(o) for o in run_opts)} "${{args[@]:1}}"
  else
    {runtime} "${{args[@]}}"
  fi
}}
{chr(10).join(lines)}
{tail}"""


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    src, runtime, coord_image, agent_image = sys.argv[1:5]
    run_opts = sys.argv[5:]
    if os.geteuid() != 0:
        print("readme_cluster: skipped: needs root (network namespaces)")
        return 77
    if missing_tool():
        print(f"readme_cluster: skipped: {missing_tool()} is not installed")
        return 77
    parts = blocks(os.path.join(src, "README.md"))
    images = {"gradsync-coordinator": coord_image, "gradsync-agent": agent_image}
    head = ADDR["c"]
    containers = []
    remove_ours(runtime)  # a run killed before its clean-up
    with Cluster(prefix="gsrc", own_sysfs=False, nodes="cabd") as cl:
        try:
            out = cl.exec("c", ["bash", "-c", shell(runtime, images, run_opts, parts["head"],
                                                    'echo "TOKEN=$GRADSYNC_TOKEN"')]).stdout
            token = re.search(r"^TOKEN=(\S+)$", out, re.M).group(1)
            containers.append("gradsync-coordinator")

            def get(path):
                return sh(*cl.enter("d"), "curl", "-s", "--max-time", "5",
                          f"http://{head}:8080{path}", check=False).stdout
            wait_until("the coordinator's /healthz from node d", lambda: '"ok"' in get("/healthz"))
            for i, n in enumerate("ab"):
                env = f"export HEAD={head} N=2 I={i} GRADSYNC_TOKEN={token}\n"
                out = cl.exec(n, ["bash", "-c", env + shell(runtime, images, run_opts,
                                                             parts["node"])]).stdout
                containers.append(out.strip().splitlines()[-1])

            def finished():
                any_out = cl.exec("d", ["bash", "-c", f"export HEAD={head}\n" +
                                        "\n".join(parts["any"])]).stdout
                try:
                    jobs = {j["name"]: j for j in json.loads(any_out)["jobs"]}
                except ValueError:
                    return None
                j = jobs.get("local")
                return j if j and j["state"] in ("finished", "failed") else None
            job = wait_until("the job finished in /status from node d", finished, timeout=6 * WAIT)
            assert job["state"] == "finished" and job["world_size"] == 2, job
            out = sh(runtime, "logs", containers[1])  # the container's stdout and stderr
            logs = out.stdout + out.stderr
            m = re.search(r"final: test accuracy ([0-9.]+)", logs)
            assert m and float(m.group(1)) >= BAR, logs[-3000:]
            page = get("/")
            assert "<title>gradsync" in page, page[:300]
            print(f"readme_cluster: the coordinator on node c ({head}), a node's ranks each on "
                  f"nodes a and b, /status from node d: job finished with 2 ranks, test accuracy "
                  f"{m.group(1)}; the dashboard served to node d")
        finally:
            # Each where it runs: the head's network is node c's.
            for n, c in zip("cab", containers):
                sh(*cl.enter(n), runtime, "rm", "-f", "-t", "0", c, check=False)
    remove_ours(runtime)
    return 0


def remove_ours(runtime):
    """Removes the containers this test started (its label), and fails
    when one stays: the next run would find the coordinator's name taken."""
    def ours():
        return sh(runtime, "ps", "-aq", "--filter", f"label={LABEL}").stdout.split()
    for c in ours():
        sh(runtime, "rm", "-f", "-t", "0", c, check=False)
    assert not ours(), f"containers labelled {LABEL} left: {ours()}"



if __name__ == "__main__":
    sys.exit(main())
