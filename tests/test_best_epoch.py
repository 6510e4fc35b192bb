"""The best epoch ships: the weights exported are those of the evaluation with the best validation
loss, measured on rows held out of the train split (never trained on), kept in the checkpoint so a
resumed run keeps its best so far; early stopping watches the same figure."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

from tests.trainer_data import points_splits, regression_splits, write_examples
from trainer import holdout
from trainer.config import TrainerConfig
from trainer.features import compute_stats, infer_feature_kinds
from trainer.inputs import load_in_memory, parsed_batches, training_stream
from trainer.loop import train
from trainer.model import make_head

# After epoch 2 (16 steps of the 410 training rows of regression_splits, batch 32, when 102 of its
# 512 are held out... counted below) the loss weight turns negative: training then climbs the loss,
# so the validation loss rises after epoch 2 whatever the data.
CLIMB_AFTER_EPOCH_2 = '''
import tensorflow as tf

STEPS_PER_EPOCH = {steps_per_epoch}


def loss_weights(step):
    return {{"target": tf.where(step <= 2 * STEPS_PER_EPOCH, 1.0, -1.0)}}
'''


class Validation:
    """A metric sink keeping the validation loss by step and what the run exported."""

    def __init__(self):
        self.losses: dict[int, float] = {}
        self.exported: dict[str, float] = {}

    def log(self, step, metrics):
        if "validation/target_loss" in metrics:
            self.losses[step] = metrics["validation/target_loss"]
        self.exported.update({k[len("exported/"):]: v for k, v in metrics.items() if k.startswith("exported/")})

    def close(self):
        pass


def weights(result):
    return [np.asarray(w) for w in result.model.get_weights()]


@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    return regression_splits(tmp_path_factory.mktemp("regression"))


@pytest.fixture(scope="module")
def climbing(regression, tmp_path_factory):
    """A module whose training climbs the loss after epoch 2, and a constant learning rate (the
    rate of a step must not depend on the run's length, so a 2-epoch run is the same first 2 epochs)."""
    held = _held_out_count(regression[0], 0.2)
    steps_per_epoch = (512 - held) // 32
    module = tmp_path_factory.mktemp("module") / "climb.py"
    module.write_text(CLIMB_AFTER_EPOCH_2.format(steps_per_epoch=steps_per_epoch))
    config = TrainerConfig(module_file=str(module), epochs=6, seed=3, deterministic=True, lr_schedule="constant",
                           learning_rate=0.01, keep_checkpoints=1)
    return config, steps_per_epoch


def _held_out_count(pattern: str, fraction: float) -> int:
    records = list(tf.data.TFRecordDataset(pattern, compression_type="GZIP").as_numpy_iterator())
    return int(tf.reduce_sum(tf.cast(holdout.held_out(tf.constant(records), fraction), tf.int32)))


def test_a_run_whose_validation_loss_rises_after_epoch_2_exports_epoch_2(regression, climbing):
    config, steps_per_epoch = climbing
    sink = Validation()
    full = train(config, *regression, "target", metric_sinks=[sink])
    epochs = sorted(sink.losses)
    assert epochs == [steps_per_epoch * e for e in range(1, 7)]
    best = min(sink.losses, key=sink.losses.get)
    assert best == 2 * steps_per_epoch and sink.losses[epochs[-1]] > 2 * sink.losses[best]  # it rose after epoch 2
    assert full.steps == 6 * steps_per_epoch  # a module on the auto metric trains every epoch
    assert full.exported == {"metric": "target_loss", "split": "validation", "value": pytest.approx(sink.losses[best]),
                             "step": best, "epoch": 2, "restored": True}
    assert sink.exported == {"step": best, "epoch": 2, "value": pytest.approx(sink.losses[best]), "restored": 1.0}
    # The weights exported are epoch 2's: the same run stopped after 2 epochs ends with them.
    two = train(config.model_copy(update={"epochs": 2}), *regression, "target")
    for a, b in zip(weights(full), weights(two)):
        np.testing.assert_array_equal(a, b)
    last = train(config.model_copy(update={"restore_best": False}), *regression, "target")
    assert last.exported == {"step": 6 * steps_per_epoch, "epoch": 6, "restored": False, "metric": "target_loss",
                             "split": "validation"}
    assert not all(np.array_equal(a, b) for a, b in zip(weights(full), weights(last)))
    # The eval split scores the exported weights: the last ones are far worse.
    assert last.metrics["target_loss"] > 2 * full.metrics["target_loss"]


def test_a_resumed_run_keeps_its_best_so_far(regression, climbing, tmp_path, caplog):
    """Stopped after epoch 4 (its best, epoch 2, is no checkpoint any more: keep_checkpoints is 1),
    then resumed: it still exports epoch 2's weights, as the run that was never stopped does."""
    config, steps_per_epoch = climbing
    straight = train(config, *regression, "target")
    train(config.model_copy(update={"max_steps": 4 * steps_per_epoch}), *regression, "target", work_dir=str(tmp_path))
    assert len(tf.train.get_checkpoint_state(str(tmp_path / "checkpoints")).all_model_checkpoint_paths) == 1
    with caplog.at_level(logging.INFO, logger="loopline.trainer"):
        resumed = train(config, *regression, "target", work_dir=str(tmp_path))
    assert f"resumed from step {4 * steps_per_epoch}" in caplog.text
    assert resumed.exported == straight.exported and resumed.exported["epoch"] == 2
    for a, b in zip(weights(straight), weights(resumed)):
        np.testing.assert_array_equal(a, b)


def test_early_stopping_stops_and_a_rerun_does_not_train_on(regression, climbing, tmp_path, caplog):
    config, steps_per_epoch = climbing
    stopping = config.model_copy(update={"early_stopping_patience": 2})
    with caplog.at_level(logging.INFO, logger="loopline.trainer"):
        stopped = train(stopping, *regression, "target", work_dir=str(tmp_path))
    assert stopped.steps == 4 * steps_per_epoch  # epochs 3 and 4 did not improve on epoch 2
    assert stopped.exported["epoch"] == 2
    assert f"early stopping at step {4 * steps_per_epoch}: target_loss has not improved for 2 evaluations" in caplog.text
    again = train(stopping, *regression, "target", work_dir=str(tmp_path))  # the stale count is in the checkpoint
    assert again.steps == stopped.steps and again.exported == stopped.exported


def test_held_out_rows_are_never_trained_on_in_memory_or_streamed(tmp_path):
    """Each row's target is its row number: the training stream's epoch holds every row but the
    held-out ones, which are the same rows (by their bytes) whichever way the split is read."""
    rows = 400
    path = write_examples(tmp_path / "train.gz", {"x": np.arange(rows, dtype=np.float32),
                                                  "target": np.arange(rows, dtype=np.float32)})
    records = list(tf.data.TFRecordDataset(path, compression_type="GZIP").as_numpy_iterator())
    held = holdout.held_out(tf.constant(records), 0.2).numpy()
    assert 50 < held.sum() < 110  # about a fifth
    kinds = infer_feature_kinds(path)
    heads = [make_head("target", kinds["target"], compute_stats(parsed_batches(path, kinds), kinds))]
    keep = lambda s: holdout.training_rows(s, 0.2)  # noqa: E731
    in_memory = load_in_memory(path, kinds, TrainerConfig().input, 8, rows=keep)
    for columns, config in ((in_memory, TrainerConfig().input), (None, TrainerConfig(input={"in_memory_mb": 0}).input)):
        stream = training_stream(path, kinds, heads, 8, config, seed=1, columns=columns, rows=keep)
        seen = np.concatenate([t["target"].numpy() for _, t in stream.take((rows - held.sum()) // 8)])
        assert not set(seen.astype(int)) & set(np.flatnonzero(held))
        assert len(set(seen.astype(int))) == len(seen) >= rows - held.sum() - 8  # one epoch: each row once
    # Another salt than ExampleGen's: a record's fate depends on its bytes, not on where it sits.
    assert (holdout.held_out(tf.constant(records[::-1]), 0.2).numpy() == held[::-1]).all()


def test_one_read_in_memory_sorts_the_rows_as_the_streamed_reads_do(tmp_path):
    """The split held in memory is read once, each record marked held out or not: the training
    rows are those the training stream would pick, the validation rows come in the same batches,
    in the same order, as when they are read from the records."""
    from trainer.inputs import columns_dataset, make_dataset, split_marked

    rows = 400
    path = write_examples(tmp_path / "train.gz", {"x": np.arange(rows, dtype=np.float32),
                                                  "target": np.arange(rows, dtype=np.float32)})
    kinds = infer_feature_kinds(path)
    heads = [make_head("target", kinds["target"], compute_stats(parsed_batches(path, kinds), kinds))]
    config = TrainerConfig().input
    marked = load_in_memory(path, kinds, config, 8, held_out=0.2)
    training, validation = split_marked(marked)
    alone = load_in_memory(path, kinds, config, 8, rows=lambda s: holdout.training_rows(s, 0.2))
    assert training["target"].numpy().tolist() == alone["target"].numpy().tolist()
    held = list(columns_dataset(validation, heads, 8, config))
    read = list(make_dataset(path, kinds, heads, 8, config, rows=lambda s: holdout.validation_rows(s, 0.2)))
    assert 50 < sum(len(t["target"]) for _, t in held) < 110
    assert [t["target"].numpy().tolist() for _, t in held] == [t["target"].numpy().tolist() for _, t in read]
    assert [f["x"].numpy().tolist() for f, _ in held] == [f["x"].numpy().tolist() for f, _ in read]


def test_under_50_held_out_rows_the_eval_split_selects_with_one_log_line(tmp_path, caplog):
    splits = regression_splits(tmp_path, rows=160)  # ~32 held out
    with caplog.at_level(logging.INFO, logger="loopline.trainer"):
        result = train(TrainerConfig(epochs=2), *splits, "target")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("validation: ")]
    assert len(lines) == 1 and "under 50, so none are held out; the eval split picks the weights" in lines[0], lines
    assert result.stats.count == 160  # every row trained on
    assert result.exported["split"] == "eval"


def test_a_module_without_heads_exports_its_last_weights_with_a_log_line(tmp_path, caplog):
    from tests.conftest import REPO

    config = TrainerConfig(module_file=str(REPO / "examples/gan/model.py"), epochs=1, max_steps=4, batch_size=64)
    with caplog.at_level(logging.INFO, logger="loopline.trainer"):
        result = train(config, *points_splits(tmp_path), "x")
    assert "the model has no heads, so nothing selects the weights" in caplog.text
    assert result.exported == {"step": 4, "epoch": 1, "restored": False}
    assert result.stats.count == 1024  # nothing held out: nothing to select on
