"""A command's log: `<pipeline.root>/logs/<run id>.log` for `loopline run`,
`<pipeline.root>/logs/<command>-<time>.log` for the others.

From `CommandLog.open` on, the process's standard error goes to the log at the file-descriptor
level, so it holds every line the process writes there: TensorFlow's C++ lines (printed before
absl starts, and later at the first op, which no Python setting stops), library warnings, MLflow's
lines, every log record. The terminal gets pipeline.console's short lines. With `verbose` (`-v`)
the log is also copied to the terminal as it is written. On a remote root the log is written to a
local file and uploaded when the command ends (a killed command leaves it in the local temporary
folder). The newest `pipeline.keep_logs` logs of each command are kept.
"""
from __future__ import annotations

import datetime
import logging
import os
import re
import sys
import tempfile
import threading
import traceback

from pipeline.config import LooplineConfig, is_remote
from pipeline.console import Console, ConsoleHandler

LOGS_DIR = "logs"
_NAME = re.compile(r"(?:(?P<command>[a-z-]+)-)?(?P<time>\d{4}-\d\d-\d\dT[\d:.]+)\.log")


def new_run_id() -> str:
    """A pipeline run's id: the time it started, in LocalDagRunner's own format."""
    return datetime.datetime.now().isoformat()


def log_name(command: str, started: str) -> str:
    """`started`: the run id for `run`, the start time (the same format) for the others."""
    return f"{started}.log" if command == "run" else f"{command}-{started}.log"


# TensorFlow's C++ INFO lines at its start (oneDNN, "Could not find cuda drivers"), printed before
# absl starts: no environment setting stops them (TF_CPP_MIN_LOG_LEVEL included).
_STARTUP_NOISE = re.compile(r"^(I\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+\] |"
                            r"WARNING: All log messages before absl::InitializeLog\(\) is called)")


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow for a command that has no log: its start-up INFO lines are dropped, any
    other line it writes to standard error (a warning, an error) still reaches the terminal."""
    if "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode("utf-8", "replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not _STARTUP_NOISE.match(line)))


class CommandLog:
    """The log of one command; `open` once the config names the root, before TensorFlow loads."""

    def __init__(self, command: str, verbose: bool = False):
        self.command, self.verbose = command, verbose
        self.path: str | None = None  # where the log is (or will be, on a remote root)
        self.console: Console | None = None  # None with verbose: the terminal gets the log itself
        self._local = None
        self._saved = None  # (fd 2 as it was, sys.stderr as it was)
        self._handler = None
        self._tee = None
        self._keep = 0
        self._created: list[str] = []  # folders made for the log, deepest first

    def open(self, config: LooplineConfig, run_id: str | None = None) -> Console | None:
        root = config.pipeline.root
        path = os.path.join(root, LOGS_DIR, log_name(self.command, run_id or new_run_id()))
        self._keep = config.pipeline.keep_logs
        if is_remote(root):
            handle, self._local = tempfile.mkstemp(prefix="loopline-", suffix=".log")
            os.close(handle)
        else:
            self._local = path
            self._created = _make_folder(os.path.dirname(path))
        log_fd = os.open(self._local, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stderr.flush()
        self._saved = (os.dup(2), sys.stderr)
        if self.verbose:
            self._tee = _Tee(log_fd, self._saved[0])
            os.dup2(self._tee.write_fd, 2)
            os.close(self._tee.write_fd)
        else:
            self.console = Console(_terminal(self._saved[0]))
            os.dup2(log_fd, 2)
            os.close(log_fd)
            sys.stderr = self.console
            self._handler = ConsoleHandler(self.console)
            logging.getLogger().addHandler(self._handler)
        logging.captureWarnings(True)  # through the log records (the root handler writes to the log)
        self.path = path
        return self.console

    def close(self, error: BaseException | None = None, message: str | None = None, discard: bool = False) -> None:
        """Ends the log (with `message` and the traceback of `error`), gives standard error back,
        uploads the log to a remote root and removes old logs; `discard`: removes it instead (a
        mistake in the config costs its one line, and leaves nothing behind). Safe to call twice."""
        if self._saved is None:
            return
        saved_fd, saved_stderr = self._saved
        self._saved = None
        sys.stderr.flush()
        saved_stderr.flush()
        ending = [message + "\n"] if message else []
        if error is not None:
            ending += traceback.format_exception(error)
        os.write(2, "".join(ending).encode("utf-8", "backslashreplace"))  # fd 2: still the log
        logging.captureWarnings(False)
        if self._handler is not None:
            logging.getLogger().removeHandler(self._handler)
        sys.stderr = saved_stderr
        if self.console is not None and self.console.stream is not saved_stderr:
            self.console.stream.close()  # the terminal's copy made by _terminal
        os.dup2(saved_fd, 2)
        os.close(saved_fd)
        if self._tee is not None:
            self._tee.finish()
        if discard:
            self._discard()
        elif self._local == self.path or self._upload():
            self._remove_old()

    def _upload(self) -> bool:
        import tensorflow as tf

        try:
            tf.io.gfile.makedirs(os.path.dirname(self.path))
            tf.io.gfile.copy(self._local, self.path, overwrite=True)
        except Exception as exc:  # noqa: BLE001 - the command's own outcome matters more; the log stays here
            print(f"loopline: warning: could not upload the log to {self.path} ({exc}); it is in {self._local}",
                  file=sys.stderr)
            self.path = self._local
            return False
        os.remove(self._local)
        return True

    def _discard(self) -> None:
        os.remove(self._local)
        for folder in self._created:
            try:
                os.rmdir(folder)
            except OSError:  # not empty: something else was written there meanwhile
                break
        self.path = None

    def _remove_old(self) -> None:
        """Keeps the newest `keep` logs of this command (by the time in their names)."""
        folder = os.path.dirname(self.path)
        remote = is_remote(folder)
        if remote:
            import tensorflow as tf

            listdir, remove = tf.io.gfile.listdir, tf.io.gfile.remove
        else:
            listdir, remove = os.listdir, os.remove
        try:
            ours = sorted(((m["time"], name) for name in listdir(folder) if (m := _NAME.fullmatch(name.rstrip("/")))
                           and (m["command"] or "run") == self.command))
            for _, name in ours[:-self._keep]:
                remove(os.path.join(folder, name))
        except Exception as exc:  # noqa: BLE001 - old logs are not worth failing a command for
            logging.getLogger("loopline").warning("could not remove old logs in %s: %s", folder, exc)


def _make_folder(folder: str) -> list[str]:
    """Makes `folder` (and its parents); returns those it made, deepest first."""
    created, missing = [], os.path.abspath(folder)
    while not os.path.isdir(missing):
        created.append(missing)
        missing = os.path.dirname(missing)
    os.makedirs(folder, exist_ok=True)
    return created


def _terminal(fd: int):
    """The terminal as a text stream: sys.stderr unless that is file descriptor 2 itself (which is
    about to become the log), e.g. under pytest's capture."""
    try:
        writes_to_fd2 = sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):
        writes_to_fd2 = False
    if not writes_to_fd2:
        return sys.stderr
    return os.fdopen(os.dup(fd), "w", buffering=1, encoding=sys.stderr.encoding or "utf-8",
                     errors="backslashreplace")


class _Tee:
    """`-v`: a pipe in place of standard error, copied to the log file and the terminal."""

    def __init__(self, log_fd: int, terminal_fd: int):
        self.read_fd, self.write_fd = os.pipe()
        self.outputs = (log_fd, os.dup(terminal_fd))
        self.thread = threading.Thread(target=self._copy, name="loopline-log-tee", daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        while chunk := os.read(self.read_fd, 65536):
            for fd in self.outputs:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]

    def finish(self) -> None:
        """Waits for what is in the pipe (a child process still holding it is not waited for)."""
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            for fd in (self.read_fd, *self.outputs):
                os.close(fd)
