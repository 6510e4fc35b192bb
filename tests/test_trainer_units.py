"""Fast unit tests of the trainer's pure rules, beside the integration tests that run them in a loop:
per-head losses, the metric direction, the calls between events, and a head's prediction key."""
import math

import numpy as np
import pytest
import tensorflow as tf

from trainer.actions import EarlyStopping, steps_to_next_event
from trainer.selection import BestMetric
from trainer.evaluation import prediction_key
from trainer.heads import CLASSIFICATION, REGRESSION, Head
from trainer.metric_direction import higher_is_better
from trainer.steps import head_losses


def _heads():
    return [Head("species", CLASSIFICATION, vocabulary=["a", "b"]), Head("mass", REGRESSION, mean=0.0, std=2.0)]


def test_head_losses_divide_by_the_global_batch_and_mask_missing_labels():
    species, mass = _heads()
    targets = {"species": tf.constant([0, 1, -1]), "mass": tf.constant([1.0, float("nan"), 3.0])}
    outputs = {"species": tf.constant([[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]]), "mass": tf.constant([[1.0], [5.0], [1.0]])}
    losses = head_losses([species, mass], targets, outputs, global_batch_size=4)
    # Classification: -log p(label) of the labelled rows; the third row has no label.
    np.testing.assert_allclose(float(losses["species"]), (-math.log(0.5) - math.log(0.75)) / 4, rtol=1e-5)
    # Regression in label standard deviations; the NaN label counts zero.
    np.testing.assert_allclose(float(losses["mass"]), (0.0 + ((1.0 - 3.0) / 2.0) ** 2) / 4, rtol=1e-6)


@pytest.mark.parametrize("metric, higher", [
    ("species_accuracy", True), ("auc", True), ("val/precision", True), ("recall-macro", True), ("f1", True),
    ("loss", False), ("mass_rmse", False), ("weighted_loss", False), ("mae", False), ("accurate_loss", False),
])
def test_metric_direction(metric, higher):
    assert higher_is_better(metric) is higher


def _stops(best: BestMetric, stopping: EarlyStopping, metrics: dict, step: int) -> bool:
    best.update(metrics, step)  # what the evaluation action does before asking
    return stopping.should_stop(step)


def test_early_stopping_follows_the_metric_direction():
    best = BestMetric("species_accuracy")
    stopping = EarlyStopping(best, patience=2)
    assert not _stops(best, stopping, {"species_accuracy": 0.5}, 1)
    assert not _stops(best, stopping, {"species_accuracy": 0.6}, 2)  # better: higher
    assert not _stops(best, stopping, {"species_accuracy": 0.55}, 3)
    assert _stops(best, stopping, {"species_accuracy": 0.6}, 4)  # not better than the best twice running
    assert (float(best.value.numpy()), int(best.step.numpy())) == (0.6, 2)
    losses = BestMetric("loss")
    stopping = EarlyStopping(losses, patience=1)
    assert not _stops(losses, stopping, {"loss": 1.0}, 1)
    assert not _stops(losses, stopping, {"loss": 0.5}, 2)  # better: lower
    assert _stops(losses, stopping, {"loss": 0.7}, 3)
    never = BestMetric("loss")  # patience None: the best is kept, training never stops early
    assert not any(_stops(never, EarlyStopping(never, None), {"loss": 1.0 + step}, step) for step in range(5))
    nan = BestMetric("loss")
    assert not nan.update({"loss": float("nan")}, 1) and nan.update({"loss": 2.0}, 2)  # a NaN is never a best
    with pytest.raises(ValueError, match="'nope' is not an eval metric"):
        BestMetric("nope").update({"loss": 1.0}, 1)


def test_a_call_runs_up_to_the_next_event():
    # (step, total, eval_every, checkpoint_every, hist_every, steps_per_loop)
    assert steps_to_next_event(0, 100, 10, 0, 0, 64) == 10
    assert steps_to_next_event(10, 100, 50, 25, 0, 64) == 15  # the checkpoint comes first
    assert steps_to_next_event(90, 95, 50, 0, 0, 64) == 5  # the end
    assert steps_to_next_event(0, 1000, 500, 0, 7, 64) == 7  # histograms
    assert steps_to_next_event(0, 1000, 500, 0, 0, 4) == 4  # steps_per_loop caps a call


def test_prediction_key_names_the_first_head_plainly_and_the_others_by_name():
    species, mass = _heads()
    assert prediction_key([species, mass], species) == "scores"
    assert prediction_key([species, mass], mass) == "mass"
    assert prediction_key([mass, species], mass) == "outputs"
    assert prediction_key([mass, species], species) == "species_scores"


def test_a_module_that_fails_to_load_fails_again_on_the_next_load(tmp_path):
    """The local runner runs every component in one process: a module whose code raised must not
    be served, empty, from the module cache to the next component that loads it."""
    import pytest

    from trainer.model import load_module

    module = tmp_path / "broken.py"
    module.write_text("LABELS = {'y': 'classification'}\nraise ValueError('module code failed')\n")
    for _ in range(2):
        with pytest.raises(ValueError, match="module code failed"):
            load_module(str(module))


def test_a_tflite_conversion_sets_objects_aside_and_leaves_a_callers_so():
    """The converter's full gc.collect() scans only the conversion's objects; objects a caller
    set aside (`loopline run` after its imports) stay aside after a conversion."""
    import gc

    from trainer.tflite import _collector_sees_new_objects_only

    assert gc.get_freeze_count() == 0
    with _collector_sees_new_objects_only():
        assert gc.get_freeze_count() > 0  # what was alive is out of the collector's sight
    assert gc.get_freeze_count() == 0  # and back after

    def collector_sees(obj) -> bool:
        return any(o is obj for o in gc.get_objects())  # the frozen generation is not among them

    callers = []
    callers.append(callers)  # a cycle: an object the collector tracks
    gc.freeze()
    try:
        assert not collector_sees(callers)
        with _collector_sees_new_objects_only():
            pass
        # One object checked, not the count: another thread may free frozen objects meanwhile.
        assert not collector_sees(callers) and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert collector_sees(callers)


def test_a_split_read_once_is_read_without_autotuning_and_in_the_same_order(tmp_path):
    """One-pass reads (the in-memory load, evaluations, statistics, counts) turn tf.data's
    autotuning off; the elements and their order are those of the autotuned read."""
    from tests.trainer_data import regression_splits
    from trainer.evaluation import example_batches
    from trainer.features import infer_feature_kinds
    from trainer.heads import Head
    from trainer.inputs import make_dataset, parsed_columns, record_dataset

    train, _ = regression_splits(tmp_path / "data", rows=3000)
    kinds = infer_feature_kinds(train)
    heads = [Head("target", REGRESSION, mean=0.0, std=1.0)]
    assert record_dataset(train).options().autotune.enabled is not False  # tf.data's default elsewhere
    evaluation = make_dataset(train, kinds, heads, 256)
    assert evaluation.options().autotune.enabled is False
    held = parsed_columns(train, kinds, 2**30)
    autotuned = record_dataset(train).batch(1000).map(lambda s: tf.io.parse_example(
        s, {name: tf.io.FixedLenFeature([], tf.float32) for name in kinds}))
    for name in kinds:
        expected = np.concatenate([batch[name].numpy() for batch in autotuned])
        np.testing.assert_array_equal(held[name].numpy().reshape(-1), expected)
    read = np.concatenate([features["x0"].numpy().reshape(-1) for features, _ in evaluation])
    np.testing.assert_array_equal(read, held["x0"].numpy().reshape(-1))
    assert sum(len(batch) for batch, _ in example_batches(train, 700, {"target": "float32"})) == 3000
