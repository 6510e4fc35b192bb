"""Three `loopline run` started together on one pipeline root (seeds 1-3), as a schedule and a
person might: the first two take turns (the run lock), the third does not wait
(`pipeline.lock_wait_seconds=0`) and stops with one line naming the run holding the root. Every
version a summary reports is a folder holding that run's own model, no version is claimed twice,
each pushed version is registered once, and MLflow tracking stays on for every training.
What each run prints without a terminal is short: a line per component, a line per epoch, the
summary; the detail is in the run's log."""
from __future__ import annotations

import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, subprocess_env
from tests.push_helpers import tree_hashes

pytestmark = pytest.mark.slow


def start_run(root: Path, seed: int, logs: Path, *extra: str) -> subprocess.Popen:
    overrides = [f"pipeline.root={root}", f"trainer.seed={seed}", "trainer.epochs=3", "export.tflite_variants=[]",
                 "evaluator.compare_to_champion=false", *extra]  # blessed on thresholds: each run pushes
    out, err = open(logs / f"run{seed}.out", "w"), open(logs / f"run{seed}.err", "w")
    return subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run", "--config", str(REPO / "loopline.yaml"),
                             *(a for o in overrides for a in ("--set", o))], cwd=REPO, env=subprocess_env(),
                            stdout=out, stderr=err)


def summary_field(text: str, name: str) -> str | None:
    found = re.search(rf"^{name}\s+(\S+)", text, re.MULTILINE)
    return found.group(1) if found else None


def check_terminal(out: str, err: str, epochs: int) -> None:
    """No TensorFlow C++ line or warning on the terminal, one line per component with its figure,
    at most 45 lines besides the epochs'; the run's log holds what the terminal left out."""
    text = out + err
    assert not re.search(r"^[IWE]\d{4} ", text, re.M), err  # I0000 ... cudart_stub, E0000 ... cuInit
    assert "warning" not in text.lower(), err  # UserWarning (MLflow's), absl's start-up WARNING line
    components = [c.split(":")[0] for c in summary_field_line(out, "components").split(", ")]
    lines = dict(re.findall(r"^(\w+) +\d+\.\ds(.*)$", err, re.M))
    assert list(lines) == components, err
    version = summary_field(out, "version")
    assert "344 rows (train 204, eval 140)" in lines["StatisticsGen"] and "blessed" in lines["Evaluator"]
    assert lines["Pusher"].strip() == f"version {version}"
    # The bundled table's train split is too small to carve validation rows from: the eval split picks.
    assert re.search(r"steps, exported epoch \d \(best eval species_loss \d", lines["Trainer"]), err
    epoch_lines = re.findall(r"^epoch \d+/\d+ step", err, re.M)
    assert len(epoch_lines) == epochs
    assert len(text.splitlines()) - len(epoch_lines) <= 45, text
    log = Path(summary_field(out, "log")).read_text()
    assert re.search(r"^[IWE]\d{4} ", log, re.M)  # TensorFlow's C++ lines, caught at the file descriptor
    for detail in ("loopline.pipeline: Trainer started", "loopline.trainer.progress: epoch 1/", "loopline.push: pushed",
                   "loopline.pipeline: Pusher", "INFO mlflow.", "loopline: MLflow run"):
        assert detail in log, detail
    assert "type hints to the `predict` method" not in log  # MLflow's warning is not raised at all


def summary_field_line(text: str, name: str) -> str:
    return re.search(rf"^{name}\s+(.*)$", text, re.MULTILINE).group(1)


def test_three_runs_at_once_on_one_root(tmp_path):
    root, logs = tmp_path / "root", tmp_path / "logs"
    logs.mkdir()
    started, cpu_before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    runs = {1: start_run(root, 1, logs), 2: start_run(root, 2, logs)}
    deadline = time.monotonic() + 300
    while not any("waiting up to" in (logs / f"run{s}.err").read_text() for s in runs):
        assert all(p.poll() is None for p in runs.values()), "a run ended before the other waited for it"
        assert time.monotonic() < deadline
        time.sleep(0.2)
    runs[3] = start_run(root, 3, logs, "pipeline.lock_wait_seconds=0")
    codes = {seed: process.wait(timeout=600) for seed, process in runs.items()}
    wall = time.monotonic() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = cpu_after.ru_utime + cpu_after.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime
    out = {s: (logs / f"run{s}.out").read_text() for s in runs}
    err = {s: (logs / f"run{s}.err").read_text() for s in runs}

    assert codes == {1: 0, 2: 0, 3: 75}, err
    run_ids = {s: summary_field(out[s], "run") for s in (1, 2)}
    lock_line = err[3].strip().splitlines()[-1]
    assert lock_line.startswith("loopline: another run holds ") and "not waiting" in lock_line
    assert any(f"loopline run {run_ids[s]} (user" in lock_line for s in (1, 2)), lock_line
    assert summary_field(out[3], "version") is None  # it did nothing

    versions = {}
    for seed in (1, 2):
        version, pushed, saved_model = (summary_field(out[seed], k) for k in ("version", "pushed to", "SavedModel"))
        assert version and version.isdigit(), out[seed]
        assert pushed == f"{root}/serving/penguins/{version}"
        # The folder holds this run's own model, the one its Trainer wrote (and its model card).
        card = "assets.extra/model_card/"
        assert {k: v for k, v in tree_hashes(pushed).items() if not k.startswith(card)} == tree_hashes(saved_model)
        assert any(k.startswith(card) for k in tree_hashes(pushed))
        versions[seed] = version
    assert len(set(versions.values())) == 2, versions  # no version claimed twice
    assert tree_hashes(f"{root}/serving/penguins/{versions[1]}") != \
        tree_hashes(f"{root}/serving/penguins/{versions[2]}")  # seeds 1 and 2: two models

    from tracking.target import TrackingTarget, make_client

    client = make_client(TrackingTarget(tracking_uri=f"sqlite:///{root / 'mlflow' / 'mlflow.db'}"))
    tagged = sorted(v.tags.get("loopline.serving_version") for v in client.search_model_versions("name = 'penguins'"))
    assert tagged == sorted(versions.values())  # each pushed version registered once
    for text in [*out.values(), *err.values()]:
        assert "tracking disabled" not in text
    for seed in (1, 2):
        check_terminal(out[seed], err[seed], epochs=3)
    print(f"\nthree overlapping runs: {wall:.0f} s wall, {cpu:.0f} CPU s in the runs; exit codes {codes}; "
          f"versions {versions}; registered {tagged}; lock line: {lock_line}")
    for seed in (1, 2):
        print(f"run {seed}: " + next(line for line in out[seed].splitlines() if line.startswith("time ")))
