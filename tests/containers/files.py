#!/usr/bin/python3
"""The container files hold what run.sh cannot see on a machine without a
runtime (it skips there) or cannot build at all (the CUDA image):

- docker/agent-cuda.Dockerfile is docker/agent.Dockerfile apart from its
  comments, base images and title/description labels, so the two cannot
  drift; every Dockerfile builds through docker/build.sh;
- every image runs as a non-root user and carries the OCI version label;
  the coordinator image has a HEALTHCHECK;
- docker/compose.yaml publishes the coordinator on 127.0.0.1 by default,
  requires GRADSYNC_TOKEN (${...:?}) everywhere it is used, spells its
  healthcheck as a string and uses no empty ${VAR:-} default (both of which
  podman-compose 1.0.3 mishandles), and gives agents shm, nofile and a
  restart policy.

usage: tests/containers/files.py SOURCE_DIR"""
import re
import sys
from pathlib import Path

import yaml

src = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[2])
errors = []


def check(ok, what):
    if not ok:
        errors.append(what)


def instructions(path):
    """The Dockerfile's instructions, comments dropped, continuations joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    return [l.strip() for l in text.splitlines() if l.strip() and not l.lstrip().startswith("#")]


def comparable(lines):
    keep = []
    for l in lines:
        if re.match(r"ARG (RUNTIME_)?BASE=", l):
            continue
        l = re.sub(r'org\.opencontainers\.image\.(title|description)="[^"]*"', "", l)
        keep.append(l)
    return keep


docker = src / "docker"
cpu, cuda = instructions(docker / "agent.Dockerfile"), instructions(docker / "agent-cuda.Dockerfile")
check(comparable(cpu) == comparable(cuda),
      "agent-cuda.Dockerfile differs from agent.Dockerfile beyond bases and labels")
check(any("nvidia/cuda" in l and "runtime" in l for l in cuda if l.startswith("ARG RUNTIME_BASE=")),
      "agent-cuda.Dockerfile's runtime base is not an NVIDIA CUDA runtime image")

for name in ("coordinator", "agent", "agent-cuda"):
    lines = instructions(docker / f"{name}.Dockerfile")
    runs = [l for l in lines if l.startswith("RUN ")]
    check(runs and all("gradsync-build" in l for l in runs), f"{name}: a RUN step bypasses docker/build.sh")
    users = [l.split()[1] for l in lines if l.startswith("USER ")]
    check(users and users[-1] not in ("root", "0"), f"{name}: does not end as a non-root USER")
    check(any('org.opencontainers.image.version="${VERSION}"' in l for l in lines),
          f"{name}: no org.opencontainers.image.version label from the VERSION build arg")
check(any(l.startswith("HEALTHCHECK ") for l in instructions(docker / "coordinator.Dockerfile")),
      "coordinator: no HEALTHCHECK")

ignore = (src / ".dockerignore").read_text().split()
for p in (".git", "build", "build-*", "wt-*"):
    check(p in ignore, f".dockerignore does not exclude {p}")

raw = (docker / "compose.yaml").read_text()
check(not re.search(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-\}", raw),
      "compose.yaml has an empty ${VAR:-} default (podman-compose leaves it unexpanded)")
compose = yaml.safe_load(raw)
services = compose["services"]
coord = services["coordinator"]
for port in coord["ports"]:
    check(str(port).startswith("${GRADSYNC_BIND:-127.0.0.1}:"), f"coordinator port {port} not on 127.0.0.1 by default")
check(isinstance(coord.get("healthcheck", {}).get("test"), str),
      "coordinator healthcheck test is not a string (podman-compose mangles lists)")
check(coord.get("restart") in ("always", "unless-stopped"), "coordinator has no restart policy")
agents = [s for n, s in services.items() if n != "coordinator"]
check(len(agents) >= 2, "compose.yaml has fewer than 2 agents")
for s in [coord] + agents:
    token = s.get("environment", {}).get("GRADSYNC_TOKEN", "")
    check(token.startswith("${GRADSYNC_TOKEN:?"), f"GRADSYNC_TOKEN not required (${{GRADSYNC_TOKEN:?...}}): {token!r}")
    check("nofile" in s.get("ulimits", {}), "a service without ulimits.nofile")
for s in agents:
    check(s.get("shm_size"), "an agent without shm_size")
    check(s.get("restart"), "an agent without a restart policy")
    check(s.get("environment", {}).get("GRADSYNC_WORLD_SIZE") == str(len(agents)),
          f"GRADSYNC_WORLD_SIZE is not the number of agents ({len(agents)})")
check(all(n.get("driver") == "bridge" for n in compose["networks"].values()), "compose network not a bridge")

for e in errors:
    print(f"container_files: {e}", file=sys.stderr)
if errors:
    sys.exit(1)
print(f"container_files: 3 Dockerfiles, compose.yaml ({len(agents)} agents) and .dockerignore as required")
