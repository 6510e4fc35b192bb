"""The run lock (pipeline.run_lock): one `loopline run` or `data accept` per ML Metadata file; the
second waits, saying who holds it, or stops with one line naming that run; a dead holder's lock
is released by the OS."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from pipeline.run_lock import RunLockedError, lock_path, run_lock
from tests.conftest import REPO, subprocess_env


def test_second_run_without_waiting_stops_with_one_line_naming_the_holder(tmp_path):
    metadata = str(tmp_path / "metadata.sqlite")
    with run_lock(metadata, "loopline run 2026-01-01T00:00:00", wait_seconds=600) as holder:
        with pytest.raises(RunLockedError) as raised:
            with run_lock(metadata, "loopline run other", wait_seconds=0):
                pytest.fail("two runs held the lock at once")
    message = str(raised.value)
    assert "\n" not in message
    assert lock_path(metadata) in message
    assert f"loopline run 2026-01-01T00:00:00 (user {holder.owner}, host {holder.host}, pid {os.getpid()}" in message
    assert "not waiting (pipeline.lock_wait_seconds=0)" in message


def test_a_waiting_run_says_who_holds_it_and_gives_up_after_the_wait(tmp_path, capsys):
    metadata = str(tmp_path / "metadata.sqlite")
    with run_lock(metadata, "loopline data accept", wait_seconds=0):
        with pytest.raises(RunLockedError, match="gave up after 1 s"):
            with run_lock(metadata, "loopline run b", wait_seconds=1):
                pass
    assert f"waiting up to 1 s for {lock_path(metadata)}, held by loopline data accept" in capsys.readouterr().err


def test_a_waiting_run_starts_when_the_holder_ends(tmp_path):
    metadata = str(tmp_path / "metadata.sqlite")
    held, order = threading.Event(), []

    def first():
        with run_lock(metadata, "loopline run a", wait_seconds=0):
            held.set()
            time.sleep(1)
            order.append("a ends")

    thread = threading.Thread(target=first)
    thread.start()
    held.wait(10)
    with run_lock(metadata, "loopline run b", wait_seconds=30):
        order.append("b starts")
    thread.join()
    assert order == ["a ends", "b starts"]


def test_a_waiting_run_keeps_its_turn_against_a_run_that_arrives_as_the_holder_ends(tmp_path, monkeypatch):
    """A waiting run polls the lock; a run arriving between the holder's end and that poll (here
    made 2 s long) finds the lock free but the turn taken, and does not run first."""
    from pipeline import run_lock as module

    monkeypatch.setattr(module, "POLL_SECONDS", 2)
    metadata = str(tmp_path / "metadata.sqlite")
    order = []

    def second():
        with run_lock(metadata, "loopline run b", wait_seconds=30):
            order.append("b runs")

    with run_lock(metadata, "loopline run a", wait_seconds=0):
        thread = threading.Thread(target=second)
        thread.start()
        deadline = time.monotonic() + 10
        while "loopline run b" not in module.read_holder(module.queue_path(lock_path(metadata))):
            assert time.monotonic() < deadline, "b never took its turn"
            time.sleep(0.01)
    with pytest.raises(RunLockedError) as raised:  # the lock is free: a is over, b has not polled yet
        with run_lock(metadata, "loopline run c", wait_seconds=0):
            order.append("c runs")
    thread.join()
    assert order == ["b runs"]
    assert "next in turn loopline run b (user" in str(raised.value) and "\n" not in str(raised.value)
    with run_lock(metadata, "loopline run c", wait_seconds=0):  # the turn is released with b's start
        order.append("c runs")
    assert order == ["b runs", "c runs"]


def test_the_lock_of_a_killed_run_is_released_by_the_os(tmp_path):
    metadata = str(tmp_path / "metadata.sqlite")
    ready = tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time, pathlib\n"
        "from pipeline.run_lock import run_lock\n"
        "with run_lock(sys.argv[1], 'loopline run killed', 0):\n"
        "    pathlib.Path(sys.argv[2]).touch()\n"
        "    time.sleep(600)\n"), metadata, str(ready)], cwd=REPO, env=subprocess_env())
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert holder.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    with pytest.raises(RunLockedError, match="loopline run killed"):
        with run_lock(metadata, "loopline run b", wait_seconds=0):
            pass
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with run_lock(metadata, "loopline run b", wait_seconds=0) as me:  # no marker file to clean up
        assert me.pid == os.getpid()


def test_cli_run_exits_75_with_the_one_line(tmp_path, capsys):
    from pipeline import cli
    from pipeline.config import load_config
    from pipeline.pipeline import metadata_path

    overrides = [f"pipeline.root={tmp_path}", "pipeline.lock_wait_seconds=0"]
    metadata = metadata_path(load_config(REPO / "loopline.yaml", overrides))
    with run_lock(metadata, "loopline run holding", wait_seconds=0):
        code = cli.main(["run", "--config", str(REPO / "loopline.yaml"), *(a for o in overrides for a in ("--set", o))])
    assert code == cli.EXIT_LOCKED == 75
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("loopline: another run holds ") and "loopline run holding" in err[-1]
    assert not (tmp_path / "tfx").exists()  # nothing ran
