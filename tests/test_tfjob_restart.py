"""The TFJob's failure path on loopback: two `loopline train` workers (MultiWorkerMirroredStrategy,
TF_CONFIG as the Training Operator sets it) checkpoint as they go; one is SIGKILLed mid-run; both
are restarted (as the operator does); both resume from the chief's last checkpoint (worker 1 may
have died between the chief's save and its own, so its per-task copy can be a save behind), and the
run ends at the same step with the same weights as a pair that was never interrupted."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import numpy as np
import portpicker
import pytest
import tensorflow as tf

from tests.conftest import REPO, subprocess_env
from tests.trainer_data import regression_splits, trained_rows

pytestmark = pytest.mark.slow

# A py_function sleep per step keeps the run long enough to be killed in the middle.
SLOW_MODULE = """
import time
import tensorflow as tf

def loss_weights(step):
    tf.py_function(lambda: time.sleep(0.01), [], [])
    return {}
"""
SETTINGS = ["trainer.strategy=multi_worker", "trainer.epochs=4", "trainer.batch_size=8",
            "trainer.checkpoint_every_steps=20", "trainer.seed=5", "trainer.deterministic=true",
            "trainer.steps_per_loop=4", "trainer.tensorboard=false", "data.label=target", "mlflow.enabled=false",
            "export.tflite_variants=[float32]", "export.latency_runs=2"]


def start_pair(splits, work_dir, module, logs_dir, tag) -> list[subprocess.Popen]:
    cluster = {"worker": [f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(2)]}
    sets = [f"--set={s}" for s in [*SETTINGS, f"trainer.module_file={module}", f"pipeline.root={work_dir}"]]
    workers = []
    for index in range(2):
        env = subprocess_env(TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}))
        log = open(logs_dir / f"{tag}-worker{index}.log", "wb")
        workers.append(subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "train", "--config", str(REPO / "loopline.yaml"),
             "--train", splits[0], "--eval", splits[1], "--work-dir", str(work_dir), *sets],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
        log.close()
    return workers


def wait_pair(workers, timeout=300) -> None:
    try:
        for worker in workers:
            worker.wait(timeout=timeout)
    finally:  # a failed worker must not leave its peer waiting for it
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    assert [w.returncode for w in workers] == [0, 0]


def checkpoint_values(folder) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(folder)))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name.startswith(("model_", "optimizer_", "step", "batches_consumed", "rng", "selection"))}


def test_worker_killed_then_both_restarted_resume_to_the_same_weights(tmp_path):
    splits = regression_splits(tmp_path / "data")
    steps = 4 * (trained_rows(splits[0]) // 8)  # the rows held out for validation are not trained on
    module = tmp_path / "slow.py"
    module.write_text(SLOW_MODULE)
    logs = tmp_path / "logs"
    logs.mkdir()
    killed_dir, straight_dir = tmp_path / "killed", tmp_path / "straight"

    first = start_pair(splits, killed_dir, module, logs, "first")
    try:
        deadline = time.monotonic() + 180
        while not (killed_dir / "checkpoints" / "ckpt-40.index").exists():
            assert all(w.poll() is None for w in first), "a worker ended before the kill"
            assert time.monotonic() < deadline, "no checkpoint at step 40 within 180 s"
            time.sleep(0.05)
        first[1].send_signal(signal.SIGKILL)  # worker 1 dies mid-run
        first[1].wait(timeout=30)
        killed_at = max(int(p.name.split("-")[1].split(".")[0]) for p in (killed_dir / "checkpoints").glob("ckpt-*.index"))
    finally:
        for worker in first:  # the chief's collectives cannot finish without worker 1: it goes too
            if worker.poll() is None:
                worker.send_signal(signal.SIGKILL)
                worker.wait(timeout=30)
    assert first[1].returncode == -signal.SIGKILL
    assert killed_at < steps and not (killed_dir / "metrics.json").exists()
    worker_copy = killed_dir / "checkpoints" / "worker-tmp-worker-1"
    assert tf.train.latest_checkpoint(str(worker_copy)) is not None, "worker 1 kept no checkpoint copy of its own"

    wait_pair(start_pair(splits, killed_dir, module, logs, "restarted"))
    resumed = [int(re.search(r"resumed from step (\d+)", (logs / f"restarted-worker{i}.log").read_text()).group(1))
               for i in range(2)]
    assert resumed[0] == resumed[1] and 40 <= resumed[0] <= killed_at, resumed

    wait_pair(start_pair(splits, straight_dir, module, logs, "straight"))
    after_kill = json.loads((killed_dir / "metrics.json").read_text())
    uninterrupted = json.loads((straight_dir / "metrics.json").read_text())
    assert after_kill["steps"] == uninterrupted["steps"] == steps
    restarted, straight = checkpoint_values(killed_dir / "checkpoints"), checkpoint_values(straight_dir / "checkpoints")
    # The weights are saved once, under the optimizer that tracks them (optimizer_model/_trainable_variables);
    # the best evaluation so far and its weights under `selection`.
    assert set(restarted) == set(straight) and any("_trainable_variables" in k for k in restarted)
    assert any(k.startswith("selection/weights") for k in restarted)
    for name, value in straight.items():
        np.testing.assert_allclose(restarted[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    # Worker 1's own copy ends where the chief's does.
    np.testing.assert_allclose(checkpoint_values(worker_copy)["step/.ATTRIBUTES/VARIABLE_VALUE"], steps)
    assert (killed_dir / "model" / "Format-Serving" / "saved_model.pb").exists()
    print(f"\nkilled worker 1 after checkpoint {killed_at}; both resumed from step {resumed[0]}; "
          f"{len(straight)} checkpoint values equal after {steps} steps")
