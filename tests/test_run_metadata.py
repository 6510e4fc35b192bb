"""Reading runs back (pipeline.run_metadata): the newest *finished* run, not the newest context; a
read-only store that never creates the file and waits out a running pipeline's writes."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
from ml_metadata.proto import metadata_store_pb2

from pipeline.config import load_config
from pipeline.pipeline import metadata_path
from pipeline.run_metadata import RUN_CONTEXT, mark_finished, newest_finished_run, open_store
from tests.conftest import REPO


def _config(root):
    return load_config(REPO / "loopline.yaml", [f"pipeline.root={root}"])


def _store_with_runs(config, names):
    store = open_store(config)
    type_id = store.put_context_type(metadata_store_pb2.ContextType(name=RUN_CONTEXT))
    store.put_contexts([metadata_store_pb2.Context(type_id=type_id, name=name) for name in names])
    return store


def test_newest_finished_run_skips_a_newer_run_still_going(tmp_path):
    config = _config(tmp_path)
    store = _store_with_runs(config, ["run-1", "run-2", "run-3"])
    mark_finished(store, "run-1", "succeeded")
    mark_finished(store, "run-2", "failed: DataAnomaliesError")  # a stopped run is finished too
    # run-3: started (its context exists), not finished: still going, or killed.
    assert newest_finished_run(open_store(config, read_only=True)).name == "run-2"


def test_read_only_store_is_never_created(tmp_path):
    config = _config(tmp_path / "root")
    with pytest.raises(FileNotFoundError, match="no pipeline runs yet"):
        open_store(config, read_only=True)
    assert not (tmp_path / "root").exists()


def test_read_only_store_refuses_writes(tmp_path):
    config = _config(tmp_path)
    _store_with_runs(config, ["run-1"])
    with pytest.raises(Exception, match="readonly"):
        mark_finished(open_store(config, read_only=True), "run-1", "succeeded")


WRITER = """
import sqlite3, sys, time, pathlib
connection = sqlite3.connect(sys.argv[1])
connection.execute("BEGIN EXCLUSIVE")
pathlib.Path(sys.argv[2]).touch()
time.sleep(5)
connection.commit()
pathlib.Path(sys.argv[3]).touch()
"""


def test_read_only_store_waits_out_a_long_write(tmp_path):
    """Another process holds SQLite's write lock for 5 s (in one process, two SQLite libraries do
    not see each other's locks): the read-only reader waits (ML Metadata's busy handler) and reads
    once the writer commits, instead of failing on a locked database."""
    config = _config(tmp_path)
    _store_with_runs(config, ["run-1"])
    reader = open_store(config, read_only=True)
    locked, done = tmp_path / "locked", tmp_path / "done"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, metadata_path(config), str(locked), str(done)])
    deadline = time.monotonic() + 30
    while not locked.exists():
        assert writer.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    runs = reader.get_contexts_by_type(RUN_CONTEXT)
    assert done.exists()  # the read happened after the writer let go, not before
    assert [r.name for r in runs] == ["run-1"]
    assert writer.wait(30) == 0
