"""One run at a time per ML Metadata file: `loopline run` and `loopline data accept` hold an OS lock
on `<metadata file>.lock` (always local, like the SQLite file), so every pipeline root that shares
that file is covered. The OS releases the lock when its process dies, however it dies; the file's
content (who holds it) is only there to be shown to the next run. Waiting runs queue: one at a
time holds the turn (`<lock file>.next`), so the lock goes to a run that waited before one that
arrived later."""
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


def queue_path(lock_file: str) -> str:
    return f"{lock_file}.next"


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


def _record(handle, holder: Holder) -> None:
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps(asdict(holder)))
    handle.flush()


class _Turn:
    """The right to take the lock next: an OS lock on `<lock file>.next`, held by at most one
    waiting run. A waiting run polls the lock; without the turn, a run arriving in the instant
    between its holder's end and the waiting run's next poll would take it first."""

    def __init__(self, path: str, command: str):
        self.path, self.command, self.held = queue_path(path), command, False
        self._handle = open(self.path, "a+")

    def take(self) -> bool:
        if not self.held and _try_lock(self._handle):
            self.held = True
            _record(self._handle, Holder.me(self.command))
        return self.held

    def close(self) -> None:  # releases the turn with the file
        self._handle.close()


def _try_in_turn(handle, turn: _Turn) -> bool:
    return turn.take() and _try_lock(handle)


def _in_the_way(path: str, turn: _Turn) -> str:
    """Who holds the lock, in words, and who waits ahead of this run for it."""
    holder = read_holder(path)
    return holder if turn.held else f"{holder}; next in turn {read_holder(turn.path)}"


def _wait_for(handle, turn: _Turn, path: str, wait_seconds: float) -> None:
    """Takes the lock, waiting up to `wait_seconds` and saying who holds it; RunLockedError after."""
    if _try_in_turn(handle, turn):
        return
    holder = _in_the_way(path, turn)
    if wait_seconds <= 0:
        raise RunLockedError(f"another run holds {path}: {holder}; not waiting (pipeline.lock_wait_seconds=0)")
    print(f"loopline: waiting up to {wait_seconds:g} s for {path}, held by {holder}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        if _try_in_turn(handle, turn):
            return
        now_holding = _in_the_way(path, turn)
        if now_holding != holder:
            holder = now_holding
            print(f"loopline: still waiting for {path}, now held by {holder}", file=sys.stderr, flush=True)
    raise RunLockedError(f"another run holds {path}: {holder}; gave up after {wait_seconds:g} s "
                         "(pipeline.lock_wait_seconds)")


@contextlib.contextmanager
def run_lock(metadata_file: str, command: str, wait_seconds: float):
    """Holds the run lock for `metadata_file` while the block runs; yields the Holder recorded.
    Waiting runs take the lock one after the other, before any run that arrives later."""
    path = lock_path(metadata_file)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a+") as handle:
        turn = _Turn(path, command)
        try:
            _wait_for(handle, turn, path, wait_seconds)
        finally:
            turn.close()
        try:
            holder = Holder.me(command)
            _record(handle, holder)
            log.debug("run lock %s taken by %s", path, holder.describe())
            yield holder
        finally:
            portalocker.unlock(handle)
