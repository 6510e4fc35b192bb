"""The embedded MLflow store (SQLite under pipeline.root) created by several commands at once: MLflow
creates the tables when a process first opens the store, and without the lock most such processes
failed (`table _alembic_tmp_experiments already exists`, `table runs already exists`: 3 and 4 of 4
processes here before the lock; this test with 3 processes failed twice in two tries without it)."""
from __future__ import annotations

import subprocess
import sys
import time

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


def test_three_processes_create_the_store_at_once(tmp_path):
    store, signals = tmp_path / "mlflow", tmp_path / "signals"
    signals.mkdir()
    children = [subprocess.Popen([sys.executable, "-c", OPEN, str(store), str(signals)], cwd=REPO,
                                 env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
