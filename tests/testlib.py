"""What every Python test shares so that it holds on a loaded machine and
leaves nothing behind: it waits on events, never on a fixed sleep, and a
timeout only decides failure. Importing it is enough for the first two:

- The test's own deadline, a little before the TIMEOUT ctest gives it
  ($GS_TEST_TIMEOUT, which tests/CMakeLists.txt sets next to TIMEOUT): past
  it a TestTimeout is raised in the main thread, so that every `finally`
  and `with` runs (processes killed, temporary folders removed) and the
  traceback says what the test was waiting for. ctest itself would SIGKILL
  the test, which cleans up nothing. SIGTERM and SIGINT end it the same way.
- Nothing left running: the test process is a subreaper
  (PR_SET_CHILD_SUBREAPER), so that whatever it started stays its
  descendant even when an intermediate process dies, and at exit every
  descendant still alive is killed.

And for the tests to use:

- WAIT: how long to wait for something that is expected to happen. It only
  decides failure: on an idle machine these waits end in seconds; a loaded
  one (two CPU hogs on two cores) can starve a process for seconds.
- Lines: a child's output read in a thread as it comes (so that its pipe
  never fills), with wait() for a line matching a pattern.
- free_port(): a port for a program that cannot be told to take port 0.
"""
import atexit
import ctypes
import os
import random
import re
import signal
import socket
import threading
import time

WAIT = 120

PR_SET_CHILD_SUBREAPER = 36


class TestTimeout(BaseException):
    """Raised in the main thread at the test's own deadline. A BaseException,
    so that no `except Exception` of the test swallows it."""


def _expired(signum, frame):
    raise TestTimeout(f"the test ran past its own deadline ({_limit[0]} s, {_MARGIN} s before "
                      f"ctest's TIMEOUT of {_limit[1]} s); see the traceback for what it waited on")


def _stopped(signum, frame):
    raise TestTimeout(f"stopped by {signal.Signals(signum).name}")


def descendants(pid=None):
    """The pids of every process below `pid` (this one by default)."""
    pid = pid or os.getpid()
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_descendants():
    """SIGKILLs every descendant still alive and reaps those that are ours."""
    for _ in range(3):  # a dying parent may have forked meanwhile
        pids = descendants()
        if not pids:
            return
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in pids:
            try:
                os.waitpid(p, 0)
            except ChildProcessError:
                pass


_MARGIN = 15
_limit = [None, None]


def _arm():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    atexit.register(kill_descendants)
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, _stopped)
    signal.signal(signal.SIGINT, _stopped)
    limit = os.environ.get("GS_TEST_TIMEOUT", "")
    if limit.isdigit() and int(limit) > 2 * _MARGIN:
        _limit[:] = [int(limit) - _MARGIN, int(limit)]
        signal.signal(signal.SIGALRM, _expired)
        signal.alarm(_limit[0])


_arm()


class Lines:
    """The lines of `stream` (a child's stdout or stderr, text mode), read
    in a thread as they come. wait() returns the first match of a pattern
    in what was read, waiting for it up to a timeout that only decides
    failure; a process given as `proc` that ends without the line fails
    the wait at once."""

    def __init__(self, stream, name="output"):
        self.name, self.lines = name, []
        self._cond = threading.Condition()
        self._done = False
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream):
        try:
            for line in stream:
                with self._cond:
                    self.lines.append(line)
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def text(self):
        with self._cond:
            return "".join(self.lines)

    def wait(self, pattern, timeout=WAIT, start=0):
        """The first match of `pattern` in the lines from line `start` on;
        AssertionError with the last lines when the stream ends or the
        timeout passes first."""
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        with self._cond:
            while True:
                for line in self.lines[start:]:
                    m = rx.search(line)
                    if m:
                        return m
                start = len(self.lines)
                left = deadline - time.monotonic()
                if self._done or left <= 0:
                    break
                self._cond.wait(min(left, 1.0))
            why = "ended" if self._done else f"said nothing matching it within {timeout} s"
            raise AssertionError(f"{self.name}: no line matching {pattern!r}: it {why}:\n"
                                 + "".join(self.lines[-40:]))

    def count(self):
        with self._cond:
            return len(self.lines)

    def close(self, timeout=WAIT):
        """Waits for the stream's end (its writer gone); the whole text."""
        self._thread.join(timeout)
        return self.text()


def wait_until(what, check, timeout=WAIT, every=0.05):
    """Calls check() until it returns something true, which it returns;
    AssertionError naming `what` past the timeout (which only decides
    failure)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(every)


def free_port():
    """A TCP port free on every address now, for a program that must be
    given one (a program that can take port 0 and say which it got should).
    It is drawn below the kernel's ephemeral range: a port that bind(0)
    hands out is one that any connect() on the machine may take next, and
    under make test's parallel tests one did, between the test's check and
    the program's listen."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    for _ in range(100):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port below the ephemeral range")
