"""Nodes on one machine: network namespaces on a private bridge, each node
with its own host name and its own /dev/shm, so that agents find their
addresses, links and shared memory as on real hosts. Shared by
tests/test_multinode.py and bench/chaos.py. Needs root."""
import os
import subprocess

SUBNET = "10.77.0"
ADDR = {"c": f"{SUBNET}.1", "a": f"{SUBNET}.2", "b": f"{SUBNET}.3", "d": f"{SUBNET}.4"}


def sh(*argv, check=True):
    p = subprocess.run(argv, capture_output=True, text=True)
    if check and p.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {p.stderr.strip()}")
    return p


def missing_tool():
    """The first of the tools a Cluster needs that is not installed, or None."""
    for tool in ("ip", "nsenter", "unshare"):
        if subprocess.run(["which", tool], capture_output=True).returncode:
            return tool
    return None


class Cluster:
    """Namespaces TAG-s (the switch: a bridge), TAG-c, TAG-a, TAG-b, each
    node with a process holding its mount and UTS namespaces (a tmpfs on
    /dev/shm, host name node-X) that the node's programs enter."""

    def __init__(self, prefix="gsmn", own_sysfs=True, nodes="cab"):
        """own_sysfs=False keeps the machine's /sys (ip netns exec mounts
        the namespace's own, without /sys/fs/cgroup, which slurmd and
        podman need); `nodes` names them (of c, a, b, d)."""
        self.tag = f"{prefix}{os.getpid() % 100000}"
        self.nets, self.holders, self.procs = [], {}, []
        self.own_sysfs = own_sysfs
        self.nodes = nodes

    def ns(self, n):
        return f"{self.tag}-{n}"

    def __enter__(self):
        try:
            for n in "s" + self.nodes:
                sh("ip", "netns", "add", self.ns(n))
                self.nets.append(self.ns(n))
            sw = self.ns("s")
            sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
            sh("ip", "-n", sw, "link", "set", "br0", "up")
            for n in self.nodes:
                sh("ip", "-n", sw, "link", "add", f"p-{n}", "type", "veth", "peer", "name", "eth0",
                   "netns", self.ns(n))
                sh("ip", "-n", sw, "link", "set", f"p-{n}", "master", "br0", "up")
                sh("ip", "-n", self.ns(n), "addr", "add", f"{ADDR[n]}/24", "dev", "eth0")
                sh("ip", "-n", self.ns(n), "link", "set", "eth0", "up")
                sh("ip", "-n", self.ns(n), "link", "set", "lo", "up")
                self.hold(n)
        except BaseException:
            self.__exit__()
            raise
        return self

    def hold(self, n):
        enter = (["ip", "netns", "exec", self.ns(n)] if self.own_sysfs
                 else ["nsenter", f"--net=/run/netns/{self.ns(n)}"])
        h = subprocess.Popen(
            enter + ["unshare", "-mu", "--propagation", "private",
                     "sh", "-c", f"mount -t tmpfs -o size=256m gs-shm-{n} /dev/shm && "
                     f"hostname node-{n} && echo ready && exec sleep 3600"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.holders[n] = h
        if h.stdout.readline().strip() != "ready":
            raise RuntimeError(f"node {n}: {h.stderr.read().strip()}")

    def enter(self, n):
        """The command prefix that runs what follows on node n (its network,
        mounts and host name); nsenter execs it, so the pid is the program's."""
        return ["nsenter", "-t", str(self.holders[n].pid), "-n", "-m", "-u", "--"]

    def run(self, n, argv, stdout=subprocess.PIPE, **kw):
        """Starts argv on node n; its output goes to `stdout` (a pipe unless
        given), stderr with it."""
        p = subprocess.Popen(self.enter(n) + argv, stdout=stdout, stderr=subprocess.STDOUT,
                             text=True, **kw)
        self.procs.append(p)
        return p

    def exec(self, n, argv):
        return sh(*self.enter(n), *argv)

    def link(self, n, state):
        """Node n's cable: the switch side of its veth up or down."""
        sh("ip", "-n", self.ns("s"), "link", "set", f"p-{n}", state)

    def shm_files(self):
        return {n: self.exec(n, ["ls", "-A", "/dev/shm"]).stdout.split() for n in "ab"}

    def __exit__(self, *exc):
        for p in self.procs + list(self.holders.values()):
            if p.poll() is None:
                p.kill()
            p.wait()
        for ns in self.nets:
            sh("ip", "netns", "del", ns, check=False)
