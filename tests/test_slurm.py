#!/usr/bin/env python3
"""A real SLURM: Debian's slurmctld and two slurmd nodes (network
namespaces with their own host names, addresses and /dev/shm:
tests/cluster.py), munge, and deploy/slurm/train.sbatch submitted with
sbatch as a user submits it:

  train     the job trains to the demo's bar over 2 nodes, one agent each
  scancel   scancel stops every rank at one step, with a checkpoint of that
            step, and every process exits on its own (none is killed)
  elastic   with GRADSYNC_MIN_RANKS=1 (--world-size 1:2), node b's agent
            killed mid-job: node a's rank goes on alone and finishes

usage: test_slurm.py BIN_DIR SOURCE_DIR
Skips (77) without root, without slurm-wlm and munge
(scripts/install-deps.sh installs them), or without the namespace tools.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import ADDR, Cluster, missing_tool, sh  # noqa: E402
from testlib import WAIT, wait_until  # noqa: E402

BIN_DIR, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
SBATCH = os.path.join(SRC, "deploy", "slurm", "train.sbatch")
BAR = 0.80  # scripts/demo.sh's job reaches about 0.86 in 3 epochs


def skip(why):
    print(f"skipped: {why}")
    sys.exit(77)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def slurm_conf(d):
    """slurm.conf for controller node-c and nodes node-a, node-b (one
    "GPU" each, a count without a device: SLURM_GPUS_ON_NODE=1), every
    file under d, no cgroups, no accounting."""
    nodes = "".join(f"NodeName=node-{n} NodeAddr={ADDR[n]} CPUs=2 RealMemory=2000 Gres=gpu:1 "
                    "State=UNKNOWN\n" for n in "ab")
    write(os.path.join(d, "gres.conf"), "NodeName=node-a,node-b Name=gpu File=/dev/null\n")
    write(os.path.join(d, "cgroup.conf"), "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n"
                                          "IgnoreSystemd=yes\n")
    conf = os.path.join(d, "slurm.conf")
    write(conf, f"""ClusterName=gradsync
SlurmctldHost=node-c({ADDR["c"]})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
GresTypes=gpu
KillWait=30
{nodes}PartitionName=test Nodes=node-a,node-b Default=YES MaxTime=INFINITE State=UP
""")
    for sub in ("state", "spool"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    return conf


def start_munge(d):
    """munged on its own key and socket under d; its process."""
    sh("mungekey", "-c", "-k", f"{d}/munge.key")
    p = subprocess.Popen(["munged", "-F", "-f", f"--key-file={d}/munge.key",
                          f"--socket={d}/munge.sock", f"--pid-file={d}/munged.pid",
                          f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_until("munged's socket", lambda: os.path.exists(f"{d}/munge.sock") or
               p.poll() is not None)
    assert p.poll() is None, p.stderr.read()
    return p


def slurm(cl, *argv, check=True):
    """A SLURM command run on node c, the controller (the submit host)."""
    return cl.exec("c", list(argv)) if check else sh(*cl.enter("c"), *argv, check=False)


def start_slurm(cl, d, conf):
    """slurmctld on node c, slurmd on nodes a and b, until both are idle."""
    hosts = os.path.join(d, "hosts")
    write(hosts, "127.0.0.1 localhost\n" +
          "".join(f"{ADDR[n]} node-{n}\n" for n in "cab"))
    for n in "cab":  # MASTER_ADDR=node-a: every node resolves the others
        cl.exec(n, ["mount", "--bind", hosts, "/etc/hosts"])
    ctld = cl.run("c", ["slurmctld", "-D", "-f", conf], stdout=subprocess.DEVNULL)
    wait_until("slurmctld answering", lambda: ctld.poll() is not None or
               "UP" in slurm(cl, "scontrol", "ping", check=False).stdout)
    assert ctld.poll() is None, open(f"{d}/slurmctld.log").read()[-2000:]
    daemons = [cl.run(n, ["slurmd", "-D", "-N", f"node-{n}", "-f", conf],
                      stdout=subprocess.DEVNULL) for n in "ab"]

    def idle():
        assert all(p.poll() is None for p in daemons), \
            "".join(open(f).read()[-1500:] for f in glob.glob(f"{d}/slurmd-*.log"))
        states = slurm(cl, "sinfo", "-h", "-N", "-o", "%T").stdout.split()
        return states == ["idle", "idle"]
    wait_until("both nodes idle", idle)


def submit(cl, d, *args, env=""):
    """sbatch of train.sbatch with the agents' args, from d; its job id."""
    out = slurm(cl, "sh", "-c", f"cd {d} && sbatch --parsable --nodes=2 --gpus-per-node=1 "
                f"--export=ALL,GRADSYNC_BIN={BIN_DIR}{env} {SBATCH} {' '.join(args)}").stdout
    return out.strip().split(";")[0]


def output(d, job):
    path = os.path.join(d, f"gradsync-{job}.out")
    return open(path).read() if os.path.exists(path) else ""


def wait_done(cl, d, job):
    """Waits until the job has left the queue; its output and ExitCode."""
    wait_until(f"job {job} to end", lambda: not slurm(
        cl, "squeue", "-h", "-j", job, check=False).stdout.strip(), timeout=4 * WAIT)
    info = slurm(cl, "scontrol", "show", "job", job).stdout
    return output(d, job), re.search(r"ExitCode=(\S+)", info).group(1)


def wait_training(d, job):
    wait_until(f"job {job} training", lambda: re.search(r"step \d+/\d+ .*samples/s",
                                                         output(d, job)), timeout=4 * WAIT)


def accuracy(text):
    m = re.search(r"final: test accuracy ([0-9.]+)", text)
    assert m, text[-3000:]
    return float(m.group(1))


def case_train(cl, d):
    job = submit(cl, d, "--epochs", "3")
    text, code = wait_done(cl, d, job)
    assert code == "0:0", (code, text[-3000:])
    for node in (0, 1):
        assert f"the 1 local rank of node {node} finished" in text, text[-3000:]
    assert re.search(r"joined generation 1: rank 1 of 2", text), text[-3000:]
    acc = accuracy(text)
    assert acc >= BAR, (acc, text[-3000:])
    print(f"train: sbatch over 2 nodes (ranks on 10.77.0.2 and .3) reached test accuracy {acc}")


def case_scancel(cl, d):
    ckpt = os.path.join(d, "ckpt")
    os.makedirs(ckpt)
    job = submit(cl, d, "--epochs", "100", "--checkpoint-dir", ckpt, "--log-interval", "500ms")
    wait_training(d, job)
    slurm(cl, "scancel", job)
    text, code = wait_done(cl, d, job)
    # Rank 0 names the signal when it was the first to get it, else says a rank did.
    m = re.search(r"stopped after step (\d+): (SIGTERM received|a rank received SIGTERM or "
                  r"SIGINT); every rank stops", text)
    assert m, text[-3000:]
    step = int(m.group(1))
    files = sorted(os.listdir(ckpt))
    assert files == [f"ckpt-{step:012d}.gsck"], (files, step)
    # Every process ended on its own: the ranks and gradsync-run with 143
    # (128 + SIGTERM, a stop), none killed, and the batch script with 143.
    assert text.count("Exited with exit code 143") == 2, text[-3000:]
    assert "SIGKILL" not in text and "Killed" not in text, text[-3000:]
    assert code == "143:0", (code, text[-3000:])
    print(f"scancel: both ranks stopped after step {step}, checkpoint {files[0]}, every process "
          f"exited on its own (143)")


def node_pids(cl, n, pattern):
    """Pids of processes matching `pattern` in node n's network namespace."""
    want = os.readlink(f"/proc/{cl.holders[n].pid}/ns/net")
    pids = []
    for pid in sh("pgrep", "-f", pattern, check=False).stdout.split():
        try:
            if os.readlink(f"/proc/{pid}/ns/net") == want:
                pids.append(int(pid))
        except OSError:
            pass
    return pids


def case_elastic(cl, d):
    job = submit(cl, d, "--epochs", "4", "--log-interval", "500ms", env=",GRADSYNC_MIN_RANKS=1")
    wait_training(d, job)
    agents = node_pids(cl, "b", "gradsync-agent --coordinator")
    assert len(agents) == 1, agents
    os.kill(agents[0], 9)
    text, code = wait_done(cl, d, job)
    assert "world of 1 rank from step" in text, text[-3000:]
    assert "the 1 local rank of node 0 finished" in text, text[-3000:]
    acc = accuracy(text)
    assert acc >= BAR, (acc, text[-3000:])
    # Node b's failure is the job's exit status (train.sbatch says so).
    assert code == "1:0", (code, text[-3000:])
    print(f"elastic: node b's agent killed (SIGKILL) mid-job; node a's rank went on alone and "
          f"finished at test accuracy {acc}")


def main():
    if os.geteuid() != 0:
        skip("needs root (network namespaces, slurmd)")
    tools = [t for t in ("slurmctld", "slurmd", "sbatch", "munged", "mungekey")
             if not shutil.which(t)]
    if tools:
        skip(f"{', '.join(tools)} not installed (scripts/install-deps.sh installs slurm-wlm "
             "and munge)")
    if missing_tool():
        skip(f"{missing_tool()} is not installed")
    start = time.time()
    d = tempfile.mkdtemp(prefix="gs-slurm-")
    os.environ["SLURM_CONF"] = slurm_conf(d)
    munge = start_munge(d)
    try:
        with Cluster(prefix="gssl", own_sysfs=False) as cl:
            try:
                start_slurm(cl, d, os.environ["SLURM_CONF"])
                case_train(cl, d)
                case_scancel(cl, d)
                case_elastic(cl, d)
            finally:
                slurm(cl, "scancel", "--user=root", check=False)
    finally:
        munge.kill()
        munge.wait()
        shutil.rmtree(d, ignore_errors=True)
    print(f"slurm: all cases in {time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
