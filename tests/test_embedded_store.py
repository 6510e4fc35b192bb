"""The embedded MLflow store (SQLite under pipeline.root) created by several commands at once: MLflow
creates the tables when a process first opens the store, and without the lock most such processes
failed (`table _alembic_tmp_experiments already exists`, `table runs already exists`: 3 and 4 of 4
processes here before the lock; this test with 3 processes failed twice in two tries without it).
A new store starts as a copy of an empty store MLflow made once per MLflow version (the template);
the processes here also make that template at once, and without a writable template folder MLflow
creates the tables itself, under the lock."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, subprocess_env

OPEN = """
import os, sys, time
from tracking.target import TrackingTarget, ensure_experiment, make_client
target = TrackingTarget(tracking_uri=f"sqlite:///{sys.argv[1]}/mlflow.db")
open(os.path.join(sys.argv[2], f"{os.getpid()}.ready"), "w").close()
while not os.path.exists(os.path.join(sys.argv[2], "go")):  # all open the store at once, imports done
    time.sleep(0.005)
client = make_client(target)
ensure_experiment(client, target)
client.search_registered_models()
print("opened")
"""


@pytest.mark.parametrize("template", ["made at once", "none"])
def test_three_processes_create_the_store_at_once(tmp_path, template):
    store, signals = tmp_path / "mlflow", tmp_path / "signals"
    signals.mkdir()
    cache = tmp_path / "cache"
    if template == "none":  # a folder that cannot be made: below a file
        (tmp_path / "a_file").write_text("")
        cache = tmp_path / "a_file" / "cache"
    env = subprocess_env(LOOPLINE_CACHE_DIR=str(cache))
    children = [subprocess.Popen([sys.executable, "-c", OPEN, str(store), str(signals)], cwd=REPO,
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(3)]
    deadline = time.monotonic() + 120
    while len(list(signals.glob("*.ready"))) < 3:
        assert all(c.poll() is None for c in children) and time.monotonic() < deadline
        time.sleep(0.05)
    (signals / "go").touch()
    for child in children:
        out, err = child.communicate(timeout=180)
        assert child.returncode == 0 and out.strip() == "opened", err[-2000:]
        assert "already exists" not in err
    assert len(list(cache.glob("mlflow-*-empty-store.db"))) == (1 if template == "made at once" else 0)


def _schema(db) -> list[tuple]:
    """Tables, indexes and their definitions; a table's columns and constraints as a sorted list
    (MLflow's own migrations write a table's CHECK constraints in varying order from run to run)."""
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    return sorted((kind, name, table, tuple(_parts(sql)) if kind == "table" and sql else sql)
                  for kind, name, table, sql in rows)


def _parts(sql: str) -> list[str]:
    """The comma-separated items inside a CREATE TABLE's outer parentheses, sorted."""
    body = sql[sql.index("(") + 1:sql.rindex(")")]
    parts, depth, current = [], 0, ""
    for char in body:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return sorted(parts + [current.strip()])


def test_a_store_from_the_template_is_the_store_mlflow_makes(tmp_path, monkeypatch):
    """The same tables, indexes and Alembic revision as a store MLflow creates itself, and it works."""
    from mlflow import MlflowClient

    from tracking.target import TrackingTarget, empty_store_template, ensure_experiment, make_client

    monkeypatch.setenv("LOOPLINE_CACHE_DIR", str(tmp_path / "cache"))
    own = tmp_path / "own.db"
    MlflowClient(tracking_uri=f"sqlite:///{own}", registry_uri=f"sqlite:///{own}").search_registered_models()
    template = empty_store_template()
    assert template.parent == tmp_path / "cache" and _schema(template) == _schema(own)
    with sqlite3.connect(template) as connection:
        assert connection.execute("SELECT count(*) FROM experiments").fetchone() == (0,)  # tables only

    target = TrackingTarget(tracking_uri=f"sqlite:///{tmp_path / 'root' / 'mlflow.db'}")
    client = make_client(target)
    assert _schema(tmp_path / "root" / "mlflow.db") == _schema(own)
    run = client.create_run(ensure_experiment(client, target))
    client.log_metric(run.info.run_id, "loss", 0.5)
    client.create_registered_model("m")
    assert client.get_run(run.info.run_id).data.metrics == {"loss": 0.5}
    assert [e.name for e in client.search_experiments()] == ["loopline", "Default"]
