"""Keeps `loopline serve` up when the model's own code crashes the server process (a custom op, a
TensorFlow kernel bug, a bad SavedModel: SIGSEGV, SIGABRT). The command runs the server in a child
process, the same command line again, and starts a new one when it dies without being asked to,
with a growing wait between rapid restarts and a limit on them. The request path stays in the
child: supervising costs nothing per request. This process imports no TensorFlow, so it stays small.

The child learns it is supervised from the environment (STATE_ENV: a folder of this supervisor,
RESTARTS_ENV, LAST_EXIT_ENV). In the folder it keeps the ports it bound, which a restarted child
binds again (the command may have said 0), and its load journal (serving.load_journal)."""
from __future__ import annotations

import ctypes
import glob
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

STATE_ENV = "LOOPLINE_SERVER_STATE"
RESTARTS_ENV = "LOOPLINE_SERVER_RESTARTS"
LAST_EXIT_ENV = "LOOPLINE_SERVER_LAST_EXIT"
PORTS_FILE = "ports.json"
STATE_PREFIX = "loopline-serve-"  # the folder: <temporary folder>/loopline-serve-<supervisor pid>-<random>

log = logging.getLogger("loopline.serving")


@dataclass(frozen=True)
class RestartPolicy:
    first_delay_s: float = 0.5  # doubles with each rapid restart, up to max_delay_s
    max_rapid_restarts: int = 5  # restarts in a row of servers that died young; one more death: give up
    max_delay_s: float = 30.0
    served_long_s: float = 60.0  # a server that ran this long died old: the delay and the count start over


# -- the supervising process --------------------------------------------------------------------
class _StopSignals:
    """SIGINT/SIGTERM: remembered and forwarded to the running child, which stops gracefully."""

    def __init__(self):
        self.received: list[int] = []
        self.child: subprocess.Popen | None = None
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._forward)

    def _forward(self, signum, _frame) -> None:
        self.received.append(signum)
        if self.child is not None and self.child.returncode is None:
            self.child.send_signal(signum)

    def watch(self, child: subprocess.Popen) -> None:
        self.child = child
        if self.received:  # arrived while the child was being started
            child.send_signal(self.received[-1])

    def sleep(self, seconds: float) -> bool:
        """Waits `seconds`; True when a stop signal came first."""
        deadline = time.monotonic() + seconds
        while not self.received and time.monotonic() < deadline:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        return bool(self.received)


def _dies_with(parent_pid: int):
    """The child's pre-exec step: the kernel kills it when this process dies, even of SIGKILL
    (PR_SET_PDEATHSIG, Linux), so no server is left holding the ports."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None  # not Linux: a SIGKILL of the supervisor leaves the server running
    pr_set_pdeathsig = 1

    def set_death_signal() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the supervisor died before the call
            os._exit(1)

    return set_death_signal


def exit_cause(returncode: int) -> str:
    """How a child ended, in words: `SIGSEGV`, `exit code 3`."""
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def _start_child(command: list[str], state: str, restarts: int, last_exit: str) -> subprocess.Popen:
    env = dict(os.environ, **{STATE_ENV: state, RESTARTS_ENV: str(restarts), LAST_EXIT_ENV: last_exit})
    return subprocess.Popen(command, env=env, preexec_fn=_dies_with(os.getpid()))


def _served(state: str, pid: int) -> bool:
    """Whether child `pid` got as far as serving (it wrote its ports)."""
    try:
        with open(os.path.join(state, PORTS_FILE)) as f:
            return json.load(f).get("pid") == pid
    except (OSError, ValueError):
        return False


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # no signal sent: only asks
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _remove_folders_of_dead_supervisors() -> None:
    """A supervisor killed by SIGKILL cannot remove its folder: the next one does."""
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), f"{STATE_PREFIX}*-*")):
        pid = os.path.basename(folder)[len(STATE_PREFIX):].split("-")[0]
        if pid.isdigit() and not _process_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def supervise(command: list[str], policy: RestartPolicy = RestartPolicy()) -> int:
    """Runs `command` (the server) until it stops as asked or stops by itself; restarts it when it
    dies of a signal, or with a non-zero code once it had served. A non-zero exit before serving is
    the server refusing to start (a bad flag, a port in use): passed on, not retried. Returns the
    exit code for the command line."""
    stop = _StopSignals()
    _remove_folders_of_dead_supervisors()
    state = tempfile.mkdtemp(prefix=f"{STATE_PREFIX}{os.getpid()}-")
    try:
        return _run(command, policy, stop, state)
    finally:
        shutil.rmtree(state, ignore_errors=True)


def _run(command: list[str], policy: RestartPolicy, stop: _StopSignals, state: str) -> int:
    restarts, rapid, delay, last_exit = 0, 0, policy.first_delay_s, ""
    while True:
        started = time.monotonic()
        child = _start_child(command, state, restarts, last_exit)
        stop.watch(child)
        code = child.wait()
        if stop.received or code == 0:
            return code if code >= 0 else 128 - code  # as a shell reports a signal's death
        if code > 0 and not _served(state, child.pid):
            return code
        last_exit = exit_cause(code)
        if time.monotonic() - started >= policy.served_long_s:
            rapid, delay = 0, policy.first_delay_s
        if rapid >= policy.max_rapid_restarts:
            print(f"loopline: error: the server process died of {last_exit}; giving up after {rapid} restart(s) in a "
                  f"row (serving.max_rapid_restarts={policy.max_rapid_restarts})", file=sys.stderr, flush=True)
            return 1
        restarts, rapid = restarts + 1, rapid + 1
        log.warning("server process died of %s; restart %d in %g s", last_exit, restarts, delay)
        if stop.sleep(delay):
            return 0
        delay = min(delay * 2, policy.max_delay_s)


# -- the supervised server (the child) ----------------------------------------------------------
def state_folder() -> str | None:
    """The supervisor's folder when this process is a supervised server, else None."""
    return os.environ.get(STATE_ENV) or None


def restarts_so_far() -> int:
    return int(os.environ.get(RESTARTS_ENV) or 0)


def last_exit() -> str:
    """How the previous server process ended (`SIGSEGV`), empty for the first one."""
    return os.environ.get(LAST_EXIT_ENV, "")


def remembered_ports() -> tuple[int | None, int | None]:
    """(gRPC, REST) ports an earlier server of this supervisor bound, or (None, None)."""
    folder = state_folder()
    try:
        with open(os.path.join(folder, PORTS_FILE)) as f:
            ports = json.load(f)
    except (TypeError, OSError, ValueError):
        return None, None
    return ports.get("grpc"), ports.get("rest")


def remember_ports(grpc_port: int | None, rest_port: int | None) -> None:
    """Once serving: the ports, for the next server, and the sign to the supervisor that this one served."""
    folder = state_folder()
    if folder is None:
        return
    temporary = os.path.join(folder, f".{PORTS_FILE}.{os.getpid()}")
    with open(temporary, "w") as f:
        json.dump({"pid": os.getpid(), "grpc": grpc_port, "rest": rest_port}, f)
    os.replace(temporary, os.path.join(folder, PORTS_FILE))
