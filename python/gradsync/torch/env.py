"""Where the job is: gs.init() reads the launcher's environment (or its
arguments), and the rank's place once a DistributedOptimizer has joined;
the process leaves the job when it ends (atexit)."""
import atexit
import os
import socket
import sys

from gradsync import _engine
from gradsync._engine import Error

_COORDINATOR_PORT = "7070"
state = {"config": None, "engine": None, "optimizers": [], "nonfinite_stop": False}


@atexit.register
def _leave_at_exit():
    """A script that ends normally has finished; one that dies of an
    uncaught exception (which sets sys.last_value) has failed. A job that
    stopped at a non-finite step failed too, however the script ended:
    the process exits with status 1 (Python cannot change the status of a
    normal exit otherwise; handlers registered before gradsync's import
    but logging's are skipped)."""
    failed = hasattr(sys, "last_value")
    for opt in state["optimizers"]:
        opt.finish(finished=not failed,
                   reason=f"the script raised {type(sys.last_value).__name__}" if failed else "")
    if state["nonfinite_stop"] and not failed:
        import logging
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _env(*names):
    """The first of the variables that is set and not empty, and its name."""
    for n in names:
        v = os.environ.get(n)
        if v:
            return v, n
    return None, None


def _number(value, name):
    try:
        n = int(value)
    except ValueError:
        raise Error(f"${name}={value!r} is not a number") from None
    if n < 0:
        raise Error(f"${name}={value!r} is negative")
    return n


def _world(value, where):
    """(MIN, MAX) from N or "MIN:MAX", as gradsync-agent's --world-size
    reads it: MIN 0 is a fixed world of N ranks; 1 <= MIN <= MAX an
    elastic job that goes on while at least MIN ranks remain."""
    text = str(value).strip()
    low, colon, high = text.partition(":")
    try:
        lo, hi = (int(low), int(high)) if colon else (0, int(text))
    except ValueError:
        raise Error(f"{where}={value!r}: expected N or MIN:MAX (an elastic job)") from None
    if hi < 1 or (colon and lo < 1):
        raise Error(f"{where}={value!r}: a world size is at least 1")
    if lo > hi:
        raise Error(f"{where}={value!r}: MIN ({lo}) is more than MAX ({hi})")
    return lo, hi


def init(coordinator=None, job=None, world_size=None, local_rank=None, node=None, token=None,
         tls_ca=None, tls_cert=None, tls_key=None, rank=None):
    """Where the job is: the arguments given, else gradsync's variables
    (set by gradsync-run), else torchrun's and SLURM's, as gradsync-agent
    reads them (docs/guide/running.md, "Environment"). `world_size` (or
    the variable) is N, or "MIN:MAX" for an elastic job (see the module's
    docstring). `rank` (else $GRADSYNC_RANK, $RANK, $SLURM_PROCID) is the
    rank the launcher numbered this process in a fixed world: gs.rank()
    answers it at once and the coordinator gives the process that rank;
    an elastic job ignores the variables (its ranks change).
    tls_ca (else $GRADSYNC_TLS_CA) speaks TLS to a coordinator started with
    --tls-cert, verifying it with that CA file; tls_cert and tls_key (else
    $GRADSYNC_TLS_CERT, $GRADSYNC_TLS_KEY) are this rank's certificate for
    one started with --tls-client-ca. Joins nothing yet: the
    DistributedOptimizer joins (and reads the files). Returns the resolved
    settings (`world_min` 0 for a fixed world)."""
    if coordinator is None:
        coordinator, _ = _env("GRADSYNC_COORDINATOR")
    if coordinator is None:
        host, _ = _env("MASTER_ADDR", "PET_MASTER_ADDR")
        if host:
            port = os.environ.get("GRADSYNC_COORDINATOR_PORT") or _COORDINATOR_PORT
            coordinator = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if not coordinator:
        raise Error("no coordinator: pass init(coordinator='HOST:PORT'), run under gradsync-run, "
                    "or set $GRADSYNC_COORDINATOR")
    if job is None:
        job, _ = _env("GRADSYNC_JOB")
        slurm, _ = _env("SLURM_JOB_ID")
        job = job or (f"slurm-{slurm}" if slurm else "local")
    if world_size is None:
        v, n = _env("GRADSYNC_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS")
        if v is None:
            raise Error("no world size: pass init(world_size=N) or set $GRADSYNC_WORLD_SIZE")
        world_min, world_size = _world(v, f"${n}")
    else:
        world_min, world_size = _world(world_size, "world_size")
    if local_rank is None:
        v, n = _env("GRADSYNC_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID")
        local_rank = _number(v, n) if v is not None else 0
    if rank is None and not world_min:
        v, n = _env("GRADSYNC_RANK", "RANK", "SLURM_PROCID")
        rank = _number(v, n) if v is not None else None
        where = f"${n}={v}"
    elif rank is not None:
        where = f"rank={rank}"
        if world_min:
            raise Error(f"{where}: an elastic job numbers its ranks at each regroup; pass no rank")
        rank = _number(rank, "rank")
    if rank is not None and rank >= world_size:
        raise Error(f"{where} is not below the world size {world_size}")
    if node is None:
        node, _ = _env("GRADSYNC_NODE", "SLURMD_NODENAME")
        node = node or socket.gethostname()
    if token is None:
        token, _ = _env("GRADSYNC_TOKEN")
    cfg = {"coordinator": coordinator, "job": job, "world_size": world_size,
           "world_min": world_min, "local_rank": int(local_rank), "node": node}
    if rank is not None:
        cfg["rank"] = rank
    if token:
        cfg["token"] = token
    for key, var in (("comm_iface", "GRADSYNC_COMM_IFACE"), ("comm_bind", "GRADSYNC_COMM_BIND"),
                     ("comm_advertise", "GRADSYNC_COMM_ADVERTISE")):
        v, _ = _env(var)
        if v:
            cfg[key] = v
    for key, given, var in (("tls_ca", tls_ca, "GRADSYNC_TLS_CA"),
                            ("tls_cert", tls_cert, "GRADSYNC_TLS_CERT"),
                            ("tls_key", tls_key, "GRADSYNC_TLS_KEY")):
        v = os.fspath(given) if given is not None else _env(var)[0]
        if v:
            cfg[key] = v
    state["config"] = cfg
    _engine.install_sigterm()
    return dict(cfg, token="***") if token else dict(cfg)


def config():
    if state["config"] is None:
        init()
    return state["config"]


def _info():
    if state["engine"] is None:
        raise Error("the rank of an elastic job (or of one started without $RANK) is known once "
                    "a DistributedOptimizer has joined the job (its construction joins: the "
                    "coordinator numbers the ranks as they join with their model). Before it: "
                    "gs.local_rank() picks the GPU, any seed works (rank 0's parameters reach "
                    "every rank), and data is sharded after it, or by "
                    "gs.DistributedSampler(dataset, optimizer=opt)")
    return state["engine"].info()


def rank():
    """This process's rank: in a fixed world started by gradsync-run,
    torchrun or srun, the launcher's number ($RANK), known from gs.init()
    on; else the coordinator's (by node, then local rank), once a
    DistributedOptimizer has joined. In an elastic job, its rank in the
    current world (it changes when the world does)."""
    if state["engine"] is None and "rank" in config():
        return config()["rank"]
    return _info()["rank"]


def world_size():
    """The number of ranks in the job: in an elastic job the current world
    once a DistributedOptimizer has joined, before that the most (MAX)."""
    if state["engine"] is not None:
        return _info()["world_size"]
    return config()["world_size"]


def local_rank():
    return config()["local_rank"]
