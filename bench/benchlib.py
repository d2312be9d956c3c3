"""What the benchmark drivers share: running a command with a timeout (its
whole process group), reading an agent's `final:` and `timing:` lines,
medians, and where the results go."""
import json
import os
import re
import signal
import statistics
import subprocess
import time

NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|-?nan|-?inf)"
# Searched, not matched, so a "[rank 0] " prefix from gradsync-run is fine.
FINAL_RE = re.compile(rf"final: test accuracy {NUM}, test loss {NUM}, {NUM} samples/s "
                      rf"over (\d+) ranks?, {NUM} s")
# "timing: step 0.512 ms = compute 0.300 + data 0.010 + comm-wait 0.050 + optimizer
# 0.152 ms (mean of 1990 steps on cuda:0; blocking waits per step: device 1.00,
# comm 0.00)": the parts are read by name, so parts added or dropped later
# still parse (the waits are absent from older builds).
TIMING_RE = re.compile(rf"timing: step {NUM} ms = (.*?) ms \(mean of (\d+) steps(?: on ([^;)]*))?"
                       rf"(?:; blocking waits per step: device {NUM}, comm {NUM})?\)[ \t]*$", re.M)
PART_RE = re.compile(rf"([a-z][a-z-]*) {NUM}")


def run_cmd(cmd, timeout, env=None):
    """Runs cmd in its own process group (so a timeout also stops the agents
    gradsync-run started), in `env` (default this process's environment);
    returns (exit code or None on timeout, output)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, env=env)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, _ = p.communicate(timeout=wait)
                return None, out
            except subprocess.TimeoutExpired:
                continue
        out, _ = p.communicate()
        return None, out


def subset(parser, flag, text, allowed):
    """The comma-separated names of `text`, each one of `allowed`; a usage
    error from `parser` naming `flag` otherwise."""
    names = [x for x in text.split(",") if x]
    if not names or any(x not in allowed for x in names):
        parser.error(f"{flag} takes a subset of {','.join(allowed)}")
    return names


def tail(text, n=15):
    return "\n".join(text.strip().splitlines()[-n:])


def run_timed(cmd, timeout, env=None):
    """Runs cmd (in `env`); returns (result dict with cmd and wall_s,
    output), or (result with the error, None) when it failed or timed out."""
    t0 = time.perf_counter()
    rc, out = run_cmd(cmd, timeout, env)
    res = {"cmd": " ".join(cmd), "wall_s": time.perf_counter() - t0, "ok": False}
    if rc != 0:
        res["error"] = f"{'timed out' if rc is None else f'exit {rc}'}:\n{tail(out)}"
        return res, None
    return res, out


def parse_ours(res, out, samples_per_step):
    """Fills res from a gradsync run's output: test accuracy and loss from
    the final line, and samples/s from the timing line's mean step time
    (steady state: the first steps are untimed), else the final line's."""
    m = FINAL_RE.search(out)
    if not m:
        res["error"] = f"no 'final:' line in the output:\n{tail(out)}"
        return res
    res.update(ok=True, test_accuracy=float(m.group(1)), test_loss=float(m.group(2)),
               final_samples_per_sec=float(m.group(3)))
    t = TIMING_RE.search(out)
    if t:
        res.update(step_ms=float(t.group(1)), timed_steps=int(t.group(3)),
                   timed_on=t.group(4),
                   parts_ms={k: float(v) for k, v in PART_RE.findall(t.group(2))})
        if t.group(5) is not None:
            res.update(device_waits=float(t.group(5)), comm_waits=float(t.group(6)))
        res["samples_per_sec"] = samples_per_step * 1e3 / res["step_ms"] if res["step_ms"] > 0 \
            else res["final_samples_per_sec"]
        res["samples_source"] = "timing"
    else:
        res["samples_per_sec"] = res["final_samples_per_sec"]
        res["samples_source"] = "final"
    return res


def parse_json_line(res, out):
    """Fills res from the last line of out that is a JSON object (the
    PyTorch reference's result)."""
    import json
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            try:
                res.update(json.loads(line))
                res["ok"] = True
            except ValueError:
                pass
            break
    if not res["ok"]:
        res["error"] = f"no JSON line in the output:\n{tail(out)}"
    return res


def median_of(runs, key):
    vals = [r[key] for r in runs if r.get("ok") and r.get(key) is not None]
    return statistics.median(vals) if vals else None


def median_parts(runs):
    """{part: median ms} over the runs with a timing line, in the line's order."""
    names = []
    for r in runs:
        for k in r.get("parts_ms", {}) if r.get("ok") else {}:
            if k not in names:
                names.append(k)
    return {k: statistics.median([r["parts_ms"][k] for r in runs
                                  if r.get("ok") and k in r.get("parts_ms", {})])
            for k in names}


def fmt(v, spec):
    return "" if v is None else format(v, spec)


def publish(table, markdown=None, json_path=None, data=None):
    """Prints the Markdown table, and writes it to `markdown` and `data` as
    JSON to `json_path` (the --markdown and --json flags)."""
    print()
    print(table, end="", flush=True)
    if markdown:
        with open(markdown, "w") as f:
            f.write(table)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(data, f, indent=1)


def add_agent_run_args(p, timeout=900):
    """The flags of a driver that runs the agent's builds: where the
    binaries and the data are, the limit per run, and where the results go."""
    p.add_argument("--bin", required=True, help="folder with gradsync-run and gradsync-agent")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--timeout", type=float, default=timeout, help="seconds per run")
    p.add_argument("--json")
    p.add_argument("--markdown")


EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                       "torch", "char_transformer.py")


def run_transformer_example(bin_dir, timeout, *flags):
    """The transformer example at 2 ranks with `flags`: samples/s (the mean
    of its progress lines), its final validation loss and the optimizer
    state rank 0 holds (MiB)."""
    cmd = [os.path.join(bin_dir, "gradsync-run"), "--nproc", "2", "--", "/usr/bin/python3",
           EXAMPLE, *flags]
    res, out = run_timed(cmd, timeout)
    if out is None:
        return res
    rates = [float(r.replace(",", "")) for r in re.findall(r"([\d,.]+) samples/s", out)]
    final = re.search(r"final val loss ([\d.]+).*optimizer state ([\d.]+) MiB", out)
    if rates and final:
        res.update(ok=True, samples_per_sec=sum(rates) / len(rates),
                   val_loss=float(final.group(1)), state_mib=float(final.group(2)))
    else:
        res["error"] = "no progress or final line"
    return res
