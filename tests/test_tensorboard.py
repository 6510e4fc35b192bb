"""TensorBoard opens what the trainer writes: its own event reader finds the loss, learning-rate
and grad-norm scalars and the histograms, and `loopline tensorboard` serves them on loopback."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import pytest
import tensorflow as tf

from tests.conftest import REPO, subprocess_env
from tests.trainer_data import plugin_tags, regression_splits
from trainer.config import TrainerConfig
from trainer.loop import train


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tb")
    splits = regression_splits(folder / "data")
    work = folder / "pipeline_root" / "train" / "penguins"
    train(TrainerConfig(epochs=1, histogram_every_steps=8, steps_per_loop=4), *splits, "target", work_dir=str(work))
    return folder / "pipeline_root", work / "tensorboard"


def test_tensorboard_reads_the_loops_summaries(run_dir):
    _, logs = run_dir
    train_tags = plugin_tags(logs / "train")
    for tag in ("loss", "learning_rate", "grad_norm", "grad_norm/hidden_0/kernel", "examples_per_sec"):
        assert tag in train_tags["scalars"], tag
    for tag in ("weights/hidden_0/kernel", "gradients/hidden_0/kernel"):
        assert tag in train_tags["histograms"], tag
    assert "target_rmse" in plugin_tags(logs / "eval")["scalars"]


def test_the_histograms_batch_is_read_only_when_histograms_are_drawn(tmp_path, monkeypatch):
    """The fixed training batch behind the gradient histograms is read on the first histogram
    step, once, and not at all by a run that draws none (the default)."""
    import trainer.build as build

    reads = []
    datasets = build._datasets

    def counted(*args, **kwargs):
        out = datasets(*args, **kwargs)
        read = out["read_probe_batch"]
        out["read_probe_batch"] = lambda: reads.append(1) or read()
        return out

    monkeypatch.setattr(build, "_datasets", counted)
    splits = regression_splits(tmp_path / "data")
    train(TrainerConfig(epochs=1, steps_per_loop=4), *splits, "target", work_dir=str(tmp_path / "plain"))
    assert reads == []
    work = tmp_path / "histograms"
    train(TrainerConfig(epochs=1, histogram_every_steps=4, steps_per_loop=4), *splits, "target", work_dir=str(work))
    assert reads == [1]  # one read, then the same batch at each of the four histogram steps
    assert "gradients/hidden_0/kernel" in plugin_tags(work / "tensorboard" / "train")["histograms"]


def test_scalars_read_back_with_their_steps_and_values(tmp_path):
    """A call's scalars go in one record; TensorBoard's reader finds each with its step and value."""
    from tensorboard.backend.event_processing import plugin_event_accumulator

    from trainer.summaries import Summaries

    summaries = Summaries(str(tmp_path), enabled=True)
    summaries.scalars("train", 3, {"loss": 0.25, "learning_rate": 1e-3})
    summaries.scalars("train", 9, {"loss": 0.125, "learning_rate": 5e-4})
    summaries.scalars("train", 10, {})
    summaries.close()
    accumulator = plugin_event_accumulator.EventAccumulator(str(tmp_path / "tensorboard" / "train"))
    accumulator.Reload()
    assert sorted(accumulator.PluginTagToContent("scalars")) == ["learning_rate", "loss"]
    read = {tag: [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in accumulator.Tensors(tag)]
            for tag in ("loss", "learning_rate")}
    assert read == {"loss": [(3, 0.25), (9, 0.125)],
                    "learning_rate": [(3, pytest.approx(1e-3)), (9, pytest.approx(5e-4))]}


def test_newest_logdir_picks_the_latest_trainer_run(run_dir, tmp_path):
    from pipeline.tensorboard import newest_logdir

    root, logs = run_dir
    assert newest_logdir(str(root)) == str(logs)
    older = tmp_path / "tfx" / "Trainer" / "model_run" / "7" / "tensorboard" / "train"  # the pipeline's layout
    older.mkdir(parents=True)
    (older / "events.out.tfevents.1").write_bytes(b"")
    os.utime(older / "events.out.tfevents.1", (1, 1))
    assert newest_logdir(str(tmp_path)) == str(older.parent)
    newer = tmp_path / "train" / "penguins" / "tensorboard" / "train"
    newer.mkdir(parents=True)
    (newer / "events.out.tfevents.2").write_bytes(b"")
    assert newest_logdir(str(tmp_path)) == str(newer.parent)
    with pytest.raises(FileNotFoundError, match="no Trainer TensorBoard logs under .*pass --logdir"):
        newest_logdir(str(tmp_path / "empty"))


@pytest.mark.slow
def test_loopline_tensorboard_serves_the_run_on_loopback(run_dir):
    root, logs = run_dir
    process = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "tensorboard", "--set", f"pipeline.root={root}",
                                "--port", "0"], cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in process.stdout:
            lines.append(line)
            if line.startswith("TensorBoard at "):
                break
        url = re.search(r"TensorBoard at (http://\S+?)/? on (\S+)", lines[-1])
        assert url, "".join(lines)[-2000:]
        assert url.group(1).startswith("http://127.0.0.1:") and url.group(2) == str(logs)
        deadline = time.monotonic() + 60
        while True:  # TensorBoard loads the event files in the background
            with urllib.request.urlopen(f"{url.group(1)}/data/plugin/scalars/tags", timeout=10) as response:
                tags = json.load(response)
            if "loss" in tags.get("train", {}) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert "loss" in tags["train"] and "learning_rate" in tags["train"]
        assert "target_rmse" in tags["eval"]
    finally:
        process.kill()
        process.wait()
