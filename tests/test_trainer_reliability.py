"""Reliability: a training process SIGKILLed mid-run resumes from its last checkpoint and ends at
the same step with the same result as a run that was never interrupted."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, subprocess_env
from tests.trainer_data import regression_splits, trained_rows

# A py_function sleep per step keeps the run long enough to be killed in the middle.
SLOW_MODULE = """
import time
import tensorflow as tf

def loss_weights(step):
    tf.py_function(lambda: time.sleep(0.01), [], [])
    return {}
"""

# jit_compile false: XLA cannot compile the module's tf.py_function.
SETTINGS = ["trainer.epochs=4", "trainer.batch_size=8", "trainer.checkpoint_every_steps=20",
            "trainer.seed=5", "trainer.deterministic=true", "trainer.steps_per_loop=4", "trainer.jit_compile=false",
            "mlflow.enabled=false"]


def command(splits, work_dir, module):
    sets = [f"--set={s}" for s in SETTINGS + [f"trainer.module_file={module}", "data.label=target",
                                              f"pipeline.root={work_dir}"]]  # the command's log goes under it
    return [sys.executable, "-m", "pipeline.cli", "train", "--train", splits[0], "--eval", splits[1],
            "--work-dir", str(work_dir), *sets]


def _latest_is(folder, name: str) -> bool:
    """The CheckpointManager's state file (`checkpoint`) names `name` as the latest checkpoint."""
    state = folder / "checkpoint"
    try:
        first = state.read_text().splitlines()[0]
    except (FileNotFoundError, IndexError):
        return False
    return first == f'model_checkpoint_path: "{name}"'


def test_sigkill_then_resume_ends_at_the_same_step_with_the_same_result(tmp_path):
    splits = regression_splits(tmp_path / "data")
    module = tmp_path / "slow.py"
    module.write_text(SLOW_MODULE)
    killed_dir, straight_dir = tmp_path / "killed", tmp_path / "straight"

    log = open(tmp_path / "killed.log", "wb")  # a file, not a pipe nobody drains while we wait
    process = subprocess.Popen(command(splits, killed_dir, module), cwd=REPO, env=subprocess_env(),
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        # The checkpoint counts once the manager's state file names it (written after the data
        # files): a kill between the two resumes, rightly, from the checkpoint before.
        while not _latest_is(killed_dir / "checkpoints", "ckpt-40"):
            assert process.poll() is None, "training ended before it could be killed"
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
    assert process.returncode == -signal.SIGKILL
    assert not (killed_dir / "metrics.json").exists()

    resumed = subprocess.run(command(splits, killed_dir, module), cwd=REPO, env=subprocess_env(),
                             capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step " in resumed.stderr
    resumed_from = int(resumed.stderr.split("resumed from step ")[1].split()[0])
    assert 40 <= resumed_from < 256

    straight = subprocess.run(command(splits, straight_dir, module), cwd=REPO, env=subprocess_env(),
                              capture_output=True, text=True, timeout=240)
    assert straight.returncode == 0, straight.stderr[-3000:]
    after_kill = json.loads((killed_dir / "metrics.json").read_text())
    uninterrupted = json.loads((straight_dir / "metrics.json").read_text())
    assert after_kill["steps"] == uninterrupted["steps"] == 4 * (trained_rows(splits[0]) // 8)
    assert after_kill["loss"] == pytest.approx(uninterrupted["loss"], rel=1e-3)
