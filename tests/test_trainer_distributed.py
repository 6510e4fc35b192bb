"""Distribution: the same global batch gives the same weights on one device, with
MirroredStrategy over two logical CPU devices, and with two MultiWorkerMirroredStrategy worker
processes on 127.0.0.1 (losses are divided by the global batch once, never twice). The step
clips by global norm, applies through the NaN guard's skip path and scales one layer's learning
rate, so those agree across replicas too."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import portpicker

from tests.conftest import REPO, subprocess_env
from tests.trainer_data import regression_splits, trained_rows


def run_worker(strategy, splits, out, logical_cpus=None, env=None, config=None):
    args = [sys.executable, "-m", "tests.trainer_worker", strategy, *splits, str(out)]
    if logical_cpus or config:
        args.append(str(logical_cpus or 1))
    if config:
        args.append(json.dumps(config))
    return subprocess.Popen(args, cwd=REPO, env=env or subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(process, timeout=240):
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, output[-3000:]


def load(path):
    data = np.load(path)
    return [data[f"arr_{i}"] for i in range(len(data.files) - 1)], int(data["steps"])


def test_mirrored_and_multi_worker_match_one_device(tmp_path):
    splits = regression_splits(tmp_path / "data")
    finish(run_worker("one_device", splits, tmp_path / "one.npz"))
    finish(run_worker("mirrored", splits, tmp_path / "mirrored.npz", logical_cpus=2))
    ports = [portpicker.pick_unused_port() for _ in range(2)]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    workers = [
        run_worker("multi_worker", splits, tmp_path / f"worker{i}.npz",
                   env=subprocess_env(TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})))
        for i in range(2)
    ]
    try:
        for worker in workers:
            finish(worker)
    finally:  # a failed worker must not leave its peer waiting for it
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()

    one, steps = load(tmp_path / "one.npz")
    assert steps == trained_rows(splits[0]) // 32
    for name in ("mirrored", "worker0", "worker1"):
        other, other_steps = load(tmp_path / f"{name}.npz")
        assert other_steps == steps and len(other) == len(one)
        for a, b in zip(one, other):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=name)


def test_jit_compile_across_cpu_replicas_is_refused_clearly(tmp_path):
    """The step all-reduces gradients inside the compiled function and XLA has no collectives on
    CPU: TensorFlow would fail deep inside the first call, so the trainer refuses up front."""
    splits = regression_splits(tmp_path / "data")
    worker = run_worker("mirrored", splits, tmp_path / "out.npz", logical_cpus=2, config={"jit_compile": True})
    output, _ = worker.communicate(timeout=240)
    assert worker.returncode != 0
    assert "trainer.jit_compile does not work with 2 replicas on CPU" in output
    assert "set trainer.jit_compile=false" in output
