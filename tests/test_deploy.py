#!/usr/bin/env python3
"""The deployment examples hold together, since no cluster is reachable
here: deploy/kubernetes/*.yaml read with a YAML parser (structure, probes,
the Indexed Job and the downward API, shared memory, GPU limits, the
NetworkPolicies, the token Secret, and every flag the commands use as the
built programs' --help lists it), and deploy/slurm/train.sbatch (bash -n,
its flags, and a run under stand-ins for srun and scontrol: a real
coordinator and two "nodes" of one agent each; skipped on a machine with
no address but loopback).

usage: test_deploy.py CASE BIN_DIR SOURCE_DIR     (CASE: kubernetes | slurm)
"""
import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    print("skipped: python3-yaml is not installed (scripts/install-deps.sh installs it)")
    sys.exit(77)

CASE, BIN_DIR, SRC = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
K8S = os.path.join(SRC, "deploy", "kubernetes")
SBATCH = os.path.join(SRC, "deploy", "slurm", "train.sbatch")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agentlib import node_address  # noqa: E402
from testlib import free_port  # noqa: E402

def help_flags(program):
    """The flags `program --help` lists (aliases too)."""
    out = subprocess.run([os.path.join(BIN_DIR, program), "--help"], capture_output=True,
                         text=True, check=True).stdout
    return set(re.findall(r"(?:^|\s|,\s)(--[a-z][a-z0-9-]*)", out, re.M))


def check_flags(program, args, known):
    """Every flag in args ("--f" or "--f=v") is one of program's."""
    for a in args:
        if not a.startswith("--") or a == "--":
            continue
        name = a.split("=", 1)[0]
        assert name in known, f"{program} has no flag {name} (its --help: {sorted(known)})"


def split_run_args(args):
    """gradsync-run's own args and the agents' (after "--")."""
    if "--" in args:
        i = args.index("--")
        return args[:i], args[i + 1:]
    return args, []


def flag_value(args, name):
    """The value of --name in args ("--name V" or "--name=V"), or None."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def load_manifests():
    """Every object of deploy/kubernetes, by (kind, name), and the files."""
    objs, files = {}, {}
    for path in sorted(glob.glob(os.path.join(K8S, "*.yaml"))):
        with open(path, encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
        files[os.path.basename(path)] = docs
        for d in docs:
            assert "apiVersion" in d and "kind" in d, (path, d)
            if d["kind"] == "Kustomization":
                continue
            key = (d["kind"], d["metadata"]["name"])
            assert key not in objs, f"{key} defined twice"
            objs[key] = d
    return objs, files


def matches(selector, labels):
    """Whether a matchLabels selector selects these labels."""
    want = selector.get("matchLabels", selector)
    return bool(want) and all(labels.get(k) == v for k, v in want.items())


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def secret_ref(container, var):
    """(secret name, key) that env var `var` comes from."""
    ref = env_of(container)[var]["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


def port_number(container, port):
    """A probe's or Service's port, by number or by the container port's name."""
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port in named, f"no container port named {port}"
    return named[port]


def check_coordinator(objs):
    """Deployment and Service: ports, probes, token; returns (pod labels,
    the service's RPC port, the secret)."""
    dep = objs[("Deployment", "gradsync-coordinator")]
    spec = dep["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate", spec
    pod = spec["template"]
    labels = pod["metadata"]["labels"]
    assert matches(spec["selector"], labels), "the Deployment's selector misses its pods"
    (c,) = pod["spec"]["containers"]
    assert "gradsync-coordinator" in c["image"], c["image"]
    check_flags("gradsync-coordinator", c["args"], help_flags("gradsync-coordinator"))
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"rpc": 7070, "http": 8080}, ports
    assert flag_value(c["args"], "--listen") == ":7070", c["args"]
    assert flag_value(c["args"], "--http") == ":8080", c["args"]
    for probe in ("readinessProbe", "livenessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/healthz" and port_number(c, get["port"]) == 8080, (probe, get)
    secret = secret_ref(c, "GRADSYNC_TOKEN")
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True

    svc = objs[("Service", "gradsync-coordinator")]
    assert svc["spec"]["selector"] == labels, "the Service selects other pods"
    sports = {p["name"]: p for p in svc["spec"]["ports"]}
    for name, number in (("rpc", 7070), ("http", 8080)):
        assert sports[name]["port"] == number, sports
        assert port_number(c, sports[name]["targetPort"]) == number, sports
    print("coordinator: Deployment + Service, probes on /healthz (8080), RPC 7070, token "
          f"from Secret {secret[0]}")
    return labels, sports["rpc"]["port"], secret


def downward(container, var):
    """The fieldPath env var `var` reads through the downward API."""
    return env_of(container)[var]["valueFrom"]["fieldRef"]["fieldPath"]


def check_agents(objs, rpc_port, secret):
    """The Indexed Job; returns (pod labels, comm port range, agents per pod)."""
    job = objs[("Job", "gradsync-agents")]
    spec = job["spec"]
    pod = spec["template"]
    (c,) = pod["spec"]["containers"]
    assert spec["completionMode"] == "Indexed", spec
    assert pod["spec"]["restartPolicy"] == "Never", pod["spec"]
    assert c["command"] == ["gradsync-run"], c["command"]
    assert "gradsync-agent-cuda" in c["image"], c["image"]
    run_args, agent_args = split_run_args(c["args"])
    check_flags("gradsync-run", run_args, help_flags("gradsync-run"))
    check_flags("gradsync-agent", agent_args, help_flags("gradsync-agent"))

    nnodes = int(flag_value(run_args, "--nnodes"))
    assert spec["completions"] == spec["parallelism"] == nnodes, (spec, nnodes)
    # Node rank: the completion index, read through the downward API.
    assert flag_value(run_args, "--node-rank") == "$(JOB_COMPLETION_INDEX)", run_args
    assert downward(c, "JOB_COMPLETION_INDEX") == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    node = re.fullmatch(r"\$\((\w+)\)", flag_value(run_args, "--node"))
    assert node and downward(c, node.group(1)) in ("metadata.name", "spec.nodeName"), run_args
    # Every $(VAR) the args use is defined before the container starts.
    for var in re.findall(r"\$\((\w+)\)", " ".join(c["args"])):
        assert var in env_of(c), f"$({var}) is not in the container's env"
    assert flag_value(run_args, "--coordinator") == f"gradsync-coordinator:{rpc_port}", run_args
    assert secret_ref(c, "GRADSYNC_TOKEN") == secret, "agents and coordinator use other tokens"
    # One GPU per agent.
    nproc = int(flag_value(run_args, "--nproc-per-node"))
    assert int(c["resources"]["limits"]["nvidia.com/gpu"]) == nproc, c["resources"]
    # /dev/shm in memory, for the shared-memory links between a pod's agents.
    shm = [m for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert len(shm) == 1, c["volumeMounts"]
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols[shm[0]["name"]]["emptyDir"]["medium"] == "Memory", vols
    # The peer ports: a fixed range with room for every agent of the pod.
    m = re.fullmatch(r"(\d+)-(\d+)", flag_value(agent_args, "--comm-port") or "")
    assert m, f"--comm-port P-Q missing from the agent args {agent_args}"
    lo, hi = int(m.group(1)), int(m.group(2))
    assert hi - lo + 1 >= nproc, (lo, hi, nproc)
    print(f"agents: Indexed Job of {nnodes} pods x {nproc} GPUs, node rank from "
          f"JOB_COMPLETION_INDEX, /dev/shm in memory, peer ports {lo}-{hi}")
    return pod["metadata"]["labels"], (lo, hi), nproc


def rules_for(policy, port):
    """The ingress rules of a NetworkPolicy that open TCP `port`."""
    out = []
    for rule in policy["spec"].get("ingress", []):
        for p in rule.get("ports", []):
            lo, hi = p["port"], p.get("endPort", p["port"])
            if p.get("protocol", "TCP") == "TCP" and lo <= port <= hi:
                out.append(rule)
    return out


def only_from(rule, labels):
    """Whether a rule admits only pods with these labels."""
    peers = rule.get("from")
    return bool(peers) and all(set(p) == {"podSelector"} and matches(p["podSelector"], labels)
                               for p in peers)


def check_policies(objs, coord_labels, agent_labels, comm):
    policies = [o for (kind, _), o in objs.items() if kind == "NetworkPolicy"]
    coord = [p for p in policies if matches(p["spec"]["podSelector"], coord_labels)]
    agents = [p for p in policies if matches(p["spec"]["podSelector"], agent_labels)]
    assert len(coord) == 1 and len(agents) == 1, "one policy for each kind of pod"
    (coord,), (agents,) = coord, agents
    for p in (coord, agents):
        assert "Ingress" in p["spec"]["policyTypes"], p
    rpc = rules_for(coord, 7070)
    assert rpc and all(only_from(r, agent_labels) for r in rpc), "7070 is open to non-agents"
    assert not matches(coord["spec"]["podSelector"], agent_labels)
    http = rules_for(coord, 8080)
    assert any("from" not in r for r in http), "the HTTP port is not reachable for status"
    for port in (comm[0], comm[1], (comm[0] + comm[1]) // 2):
        rules = rules_for(agents, port)
        assert rules and all(only_from(r, agent_labels) for r in rules), (port, rules)
    assert not rules_for(agents, comm[1] + 1), "the agents' policy opens more than the range"
    print("NetworkPolicy: 7070 from agents only, 8080 open, agents' peer range from agents only")


def case_kubernetes():
    objs, files = load_manifests()
    coord_labels, rpc_port, secret = check_coordinator(objs)
    agent_labels, comm, _ = check_agents(objs, rpc_port, secret)
    check_policies(objs, coord_labels, agent_labels, comm)
    # The example Secret: the name and key both sides read, a placeholder,
    # and never applied by kustomization.yaml.
    example = objs[("Secret", secret[0])]
    assert secret[1] in example["stringData"], example
    assert "REPLACE" in example["stringData"][secret[1]], "the example holds a real-looking token"
    kust = files["kustomization.yaml"][0]
    listed = set(kust["resources"])
    assert "secret.example.yaml" not in listed
    want = set(files) - {"kustomization.yaml", "secret.example.yaml"}
    assert listed == want, (listed, want)
    namespaces = {o["metadata"].get("namespace") for (kind, _), o in objs.items()
                  if kind != "Namespace"}
    assert namespaces == {"gradsync"}, namespaces
    print("kubernetes: ok")


# srun's stand-in: each of $SLURM_NNODES "nodes" runs the command (after
# srun's own options) at once with the variables srun sets per task; the
# first failure is its status.
FAKE_SRUN = r"""#!/usr/bin/env bash
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do
  SLURM_NODEID=$i SLURM_PROCID=$i SLURM_LOCALID=0 SLURMD_NODENAME=fake-$i SLURM_NTASKS=$SLURM_NNODES \
    "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
"""
FAKE_SCONTROL = "#!/bin/sh\n[ \"$1 $2\" = \"show hostnames\" ] && echo {host}\n"


def sbatch_commands():
    """The gradsync-run and gradsync-coordinator command lines of the
    script, continuation lines joined, as word lists."""
    with open(SBATCH, encoding="utf-8") as f:
        text = f.read().replace("\\\n", " ")
    cmds = {}
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for prog in ("gradsync-run", "gradsync-coordinator"):
            m = re.search(prog + r'"?\s+(.*)', line)
            if m:
                cmds[prog] = m.group(1).split()
    return cmds


def case_slurm():
    subprocess.run(["bash", "-n", SBATCH], check=True)
    cmds = sbatch_commands()
    assert set(cmds) == {"gradsync-run", "gradsync-coordinator"}, cmds
    run_args, agent_args = split_run_args(cmds["gradsync-run"])
    check_flags("gradsync-run", run_args, help_flags("gradsync-run"))
    check_flags("gradsync-agent", agent_args, help_flags("gradsync-agent"))
    check_flags("gradsync-coordinator", cmds["gradsync-coordinator"],
                help_flags("gradsync-coordinator"))
    # The node settings come from SLURM's variables, not flags.
    for flag in ("--nnodes", "--node-rank", "--coordinator", "--job", "--node"):
        assert flag_value(run_args, flag) is None, (flag, run_args)
    print("train.sbatch: bash -n passes; its flags are the programs'")

    host = node_address()
    if host == "127.0.0.1":
        # Two node names on loopback addresses are refused at rendezvous.
        print("skipped: the run of train.sbatch needs an address other than loopback")
        sys.exit(77)
    with tempfile.TemporaryDirectory(prefix="gs_sbatch_") as tmp:
        fake = os.path.join(tmp, "bin")
        os.mkdir(fake)
        for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL.format(host=host))):
            with open(os.path.join(fake, name), "w") as f:
                f.write(text)
            os.chmod(os.path.join(fake, name), 0o755)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GRADSYNC_", "SLURM", "MASTER_", "PET_", "WORLD_SIZE",
                                    "RANK", "LOCAL_RANK", "JOB_COMPLETION_INDEX"))}
        env.update(PATH=fake + ":" + env["PATH"], GRADSYNC_BIN=os.path.abspath(BIN_DIR),
                   SLURM_JOB_ID="5151", SLURM_NNODES="2", SLURM_JOB_NODELIST="fake-[0-1]",
                   GPUS_PER_NODE="1", GRADSYNC_COORDINATOR_PORT=str(free_port()),
                   GRADSYNC_HTTP_PORT=str(free_port()))
        p = subprocess.run(["bash", SBATCH, "--steps", "5", "--no-validate"], cwd=tmp, env=env,
                           capture_output=True, text=True, timeout=240)
        out = p.stdout + p.stderr
        assert p.returncode == 0, out
        port = env["GRADSYNC_COORDINATOR_PORT"]
        for i in range(2):
            assert f"node {i} of 2: 1 agent joining {host}:{port} as job slurm-5151" in out, out
            assert f"as node 'fake-{i}' local rank 0 (world size 2)" in out, out
        assert "final: test accuracy" in out, out
        with open(os.path.join(tmp, "coordinator-5151.log")) as f:
            log = f.read()
        assert "listening rpc=" in log, log
        # The coordinator went with the script, and the token stayed out of sight.
        with socket.socket() as s:
            assert s.connect_ex((host, int(port))) != 0, "the coordinator outlived the job"
        token = re.search(r"[0-9a-f]{64}", out + log)
        assert token is None, "a token-like string was printed"
    print("train.sbatch under stand-ins for srun and scontrol: 2 nodes trained as job "
          "slurm-5151; the coordinator stopped with the script")
    print("slurm: ok")


if __name__ == "__main__":
    if shutil.which("bash") is None:
        print("skipped: no bash")
        sys.exit(77)
    {"kubernetes": case_kubernetes, "slurm": case_slurm}[CASE]()
