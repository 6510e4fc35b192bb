"""One run at a time per ML Metadata file: `loopline run` and `loopline data accept` hold an OS lock
on `<metadata file>.lock` (always local, like the SQLite file), so every pipeline root that shares
that file is covered. The OS releases the lock when its process dies, however it dies; the file's
content (who holds it) is only there to be shown to the next run."""
from __future__ import annotations

import contextlib
import datetime
import getpass
import json
import logging
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass

import portalocker

log = logging.getLogger("loopline")

POLL_SECONDS = 0.5


class RunLockedError(RuntimeError):
    """Another run holds the lock; the message is one line naming it."""


@dataclass
class Holder:
    command: str  # e.g. "loopline run 2026-12-01T10:00:00.123456"
    owner: str
    host: str
    pid: int
    started: str  # ISO time, local

    def describe(self) -> str:
        return f"{self.command} (user {self.owner}, host {self.host}, pid {self.pid}, started {self.started})"

    @classmethod
    def me(cls, command: str) -> "Holder":
        try:
            owner = getpass.getuser()
        except (KeyError, OSError):  # no user name in some containers
            owner = str(os.getuid())
        return cls(command, owner, socket.gethostname(), os.getpid(),
                   datetime.datetime.now().isoformat(timespec="seconds"))


def lock_path(metadata_file: str) -> str:
    return f"{metadata_file}.lock"


def read_holder(path: str) -> str:
    """Who holds the lock, in words (the file may be half written for an instant after it was taken)."""
    try:
        with open(path) as f:
            return Holder(**json.loads(f.read())).describe()
    except (OSError, ValueError, TypeError):
        return "a run that has not recorded itself yet"


def _try_lock(handle) -> bool:
    try:
        portalocker.lock(handle, portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING)
        return True
    except portalocker.exceptions.LockException:
        return False


def _wait_for(handle, path: str, wait_seconds: float) -> None:
    """Takes the lock, waiting up to `wait_seconds` and saying who holds it; RunLockedError after."""
    if _try_lock(handle):
        return
    holder = read_holder(path)
    if wait_seconds <= 0:
        raise RunLockedError(f"another run holds {path}: {holder}; not waiting (pipeline.lock_wait_seconds=0)")
    print(f"loopline: waiting up to {wait_seconds:g} s for {path}, held by {holder}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        if _try_lock(handle):
            return
        now_holding = read_holder(path)
        if now_holding != holder:
            holder = now_holding
            print(f"loopline: still waiting for {path}, now held by {holder}", file=sys.stderr, flush=True)
    raise RunLockedError(f"another run holds {path}: {holder}; gave up after {wait_seconds:g} s "
                         "(pipeline.lock_wait_seconds)")


@contextlib.contextmanager
def run_lock(metadata_file: str, command: str, wait_seconds: float):
    """Holds the run lock for `metadata_file` while the block runs; yields the Holder recorded."""
    path = lock_path(metadata_file)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a+") as handle:
        _wait_for(handle, path, wait_seconds)
        try:
            holder = Holder.me(command)
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps(asdict(holder)))
            handle.flush()
            log.debug("run lock %s taken by %s", path, holder.describe())
            yield holder
        finally:
            portalocker.unlock(handle)
