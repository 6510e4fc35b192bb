"""Metrics: one direction rule for every metric name; stateful keras.metrics over a whole split
(an AUC matches scikit-learn's); training accuracy per classification head; the speed settings'
auto defaults."""
from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import tensorflow as tf
from sklearn.metrics import roc_auc_score

from tests.trainer_data import binary_splits, regression_splits
from tests.trainer_modules import Recorder
from trainer.config import TrainerConfig
from trainer.blessing import decide
from trainer.evaluator_config import EvaluatorConfig
from trainer.metric_direction import higher_is_better
from trainer.inputs import make_dataset
from trainer.loop import EarlyStopping, train
from trainer.selection import BestMetric
from trainer.speed import XLA_CPU_MAX_DENSE_FLOPS, XLA_CPU_MIN_STEPS, Speed, resolve_speed


def test_one_direction_rule_for_early_stopping_and_blessing():
    for name in ("species_accuracy", "auc", "label_auc_pos", "precision", "recall", "macro_f1"):
        assert higher_is_better(name), name
    for name in ("loss", "weighted_loss", "target_rmse", "body_mass_g_mae", "species_loss"):
        assert not higher_is_better(name), name
    best = BestMetric("label_auc")
    stopping = EarlyStopping(best, patience=1)
    for step, value in ((1, 0.80), (2, 0.85), (3, 0.84)):
        improved = best.update({"label_auc": value}, step)
        assert improved == (step < 3)  # higher: an improvement
        assert stopping.should_stop(step) == (step == 3)
    config = EvaluatorConfig(regression_metrics=["label_auc"], relative_tolerance=0.0, absolute_tolerance=0.01)
    assert not decide({"label_auc": 0.80}, {"label_auc": 0.90}, config).blessed
    assert decide({"label_auc": 0.95}, {"label_auc": 0.90}, config).blessed


AUC_MODULE = '''
import keras
import tensorflow as tf

LABELS = {"label": "classification"}


def build_metrics(ctx):
    def positive_scores(targets, outputs):  # vocabulary ["neg", "pos"]: index 1 is "pos"
        labelled = tf.cast(targets["label"] >= 0, tf.float32)
        return tf.cast(targets["label"] == 1, tf.float32), outputs["label"][:, 1], labelled

    return {"label_auc": (keras.metrics.AUC(num_thresholds=2000), positive_scores)}
'''


def test_stateful_auc_over_the_whole_split_matches_sklearn(tmp_path):
    splits = binary_splits(tmp_path / "data")
    module = tmp_path / "auc.py"
    module.write_text(AUC_MODULE)
    recorder = Recorder()
    result = train(TrainerConfig(module_file=str(module), epochs=3, batch_size=32), *splits, "label",
                   metric_sinks=[recorder])
    head = result.heads[0]
    data = make_dataset(splits[1], {**result.kinds, "label": "string"}, result.heads, 32)
    labels, scores, batch_aucs = [], [], []
    for features, targets in data:
        batch_labels, batch_scores = targets["label"].numpy() == 1, result.model(features)["label"].numpy()[:, 1]
        labels.append(batch_labels)
        scores.append(batch_scores)
        batch_aucs.append(roc_auc_score(batch_labels, batch_scores))
    whole = roc_auc_score(np.concatenate(labels), np.concatenate(scores))
    assert head.vocabulary == ["neg", "pos"] and 0.6 < whole < 0.95
    assert result.metrics["label_auc"] == pytest.approx(whole, abs=1e-3)
    # A per-batch AUC is not the split's: batches of 32 are far from it (their mean can land close
    # by chance: 0.0002 once, so the mean is not what this compares).
    assert np.median(np.abs(np.array(batch_aucs) - whole)) > 1e-2
    accuracy = recorder.series("label_accuracy")  # training accuracy, per call
    assert len(accuracy) > 1 and 0.6 < accuracy[-1] <= 1.0 and accuracy[-1] > accuracy[0]


def test_speed_auto_picks_the_fast_settings_where_safe(monkeypatch):
    # The serve command sets TF_ENABLE_ONEDNN_OPTS in its process (tests run it in this one).
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    auto = TrainerConfig()
    assert (auto.jit_compile, auto.steps_per_loop) == ("auto", "auto")
    assert resolve_speed(auto, 1, False, False, 100) == Speed(True, 32)
    assert resolve_speed(auto, 1, False, False, 10) == Speed(True, 10)  # the epoch, when shorter
    assert resolve_speed(auto, 2, False, False, 100) == Speed(False, 32)  # replicas: XLA off
    assert resolve_speed(auto, 1, False, True, 100) == Speed(False, 32)  # train_step override: XLA off
    assert resolve_speed(TrainerConfig(debug=True), 1, False, False, 100) == Speed(False, 1)
    assert resolve_speed(TrainerConfig(deterministic=True), 1, False, False, 100) == Speed(False, 32)  # no deterministic XLA MaxPoolGrad
    # On CPU, a step whose Dense layers take XLA_CPU_MAX_DENSE_FLOPS or more runs without XLA
    # (it trained faster there); below it, or with oneDNN off (not measured: the old rule), XLA stays on.
    assert resolve_speed(auto, 1, False, False, 100, cpu_dense_flops=XLA_CPU_MAX_DENSE_FLOPS) == Speed(False, 32)
    assert resolve_speed(auto, 1, False, False, 100, cpu_dense_flops=XLA_CPU_MAX_DENSE_FLOPS - 1) == Speed(True, 32)
    assert resolve_speed(TrainerConfig(jit_compile=True), 1, False, False, 100,
                         cpu_dense_flops=XLA_CPU_MAX_DENSE_FLOPS) == Speed(True, 32)  # explicit: as asked
    # On CPU, a run too short to pay back XLA's compile runs without it; on accelerators
    # (cpu_dense_flops None) the run's length is not weighed; an explicit true is as asked.
    small_step = XLA_CPU_MAX_DENSE_FLOPS // 1000
    assert resolve_speed(auto, 1, False, False, 100, small_step, total_steps=XLA_CPU_MIN_STEPS - 1) == Speed(False, 32)
    assert resolve_speed(auto, 1, False, False, 100, small_step, total_steps=XLA_CPU_MIN_STEPS) == Speed(True, 32)
    assert resolve_speed(auto, 1, False, False, 100, None, total_steps=10) == Speed(True, 32)
    assert resolve_speed(TrainerConfig(jit_compile=True), 1, False, False, 100, small_step, total_steps=10) == Speed(True, 32)
    explicit = TrainerConfig(jit_compile=False, steps_per_loop=5)
    assert resolve_speed(explicit, 1, False, False, 100) == Speed(False, 5)
    with pytest.raises(ValueError, match="trainer.jit_compile=true cannot apply with trainer.debug=true"):
        resolve_speed(TrainerConfig(jit_compile=True, debug=True), 1, False, False, 100)
    with pytest.raises(ValueError, match="trainer.jit_compile does not work with 2 replicas on CPU"):
        resolve_speed(TrainerConfig(jit_compile=True), 2, True, False, 100)


def test_config_accepts_auto_or_explicit_speed_settings():
    from pipeline.config import ConfigError, load_config

    config = load_config(None, ["trainer.jit_compile=true", "trainer.steps_per_loop=8"])
    assert (config.trainer.jit_compile, config.trainer.steps_per_loop) == (True, 8)
    assert load_config(None, ["trainer.steps_per_loop=auto"]).trainer.steps_per_loop == "auto"
    with pytest.raises(ConfigError, match="trainer.steps_per_loop"):
        load_config(None, ["trainer.steps_per_loop=0"])


def test_default_run_logs_the_speed_it_chose(tmp_path, caplog, monkeypatch):
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)  # as a serve command in this process may have set it
    splits = regression_splits(tmp_path / "data")
    with caplog.at_level(logging.INFO, logger="loopline.trainer"):
        train(TrainerConfig(epochs=1, validation_fraction=0), *splits, "target")  # all 512 rows: 16 steps
    assert "XLA off (on CPU a run of 16 steps is too short to pay back XLA's compile" in caplog.text
    assert "speed: jit_compile=False (auto), steps_per_loop=16 (auto)" in caplog.text
    monkeypatch.setattr("trainer.speed.XLA_CPU_MIN_STEPS", 16)  # as long a run as XLA needs
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="loopline.trainer"):
        train(TrainerConfig(epochs=1, validation_fraction=0), *splits, "target")
    assert "speed: jit_compile=True (auto), steps_per_loop=16 (auto)" in caplog.text
    assert tf.config.functions_run_eagerly() is False


def test_auto_xla_is_off_on_cpu_for_a_step_of_large_matmuls(tmp_path, caplog, monkeypatch):
    """4 x 1024 Dense layers at batch 256: ~4.8 GFLOP a step, counted from the built model."""
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)  # as a serve command in this process may have set it
    splits = regression_splits(tmp_path / "data")
    module = tmp_path / "wide.py"
    module.write_text("import keras\n"
                      "def build_model(ctx):\n"
                      "    inputs = ctx.inputs()\n"
                      "    x = ctx.encoder()(inputs)\n"
                      "    for i in range(4):\n"
                      "        x = keras.layers.Dense(1024, activation='relu')(x)\n"
                      "    return keras.Model(inputs, {h.name: h.output_layer(x) for h in ctx.heads})\n")
    config = TrainerConfig(module_file=str(module), epochs=1, max_steps=1, batch_size=256, validation_fraction=0)
    with caplog.at_level(logging.INFO, logger="loopline.trainer"):
        train(config, *splits, "target")
    taken = re.search(r"XLA off \(on CPU the step's Dense layers take ([\d.]+) GFLOP", caplog.text)
    assert taken and 4.5 < float(taken.group(1)) < 5.0  # 3 x 2 x 256 x (in x 1024 + 3 x 1024 x 1024 + ...)
    assert "speed: jit_compile=False (auto)" in caplog.text
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")  # oneDNN off: the rule does not apply
    monkeypatch.setattr("trainer.speed.XLA_CPU_MIN_STEPS", 1)  # nor the one on the run's length
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="loopline.trainer"):
        train(config, *splits, "target")
    assert "speed: jit_compile=True (auto)" in caplog.text


def test_weighted_loss_from_the_heads_weights_and_loss_unweighted():
    from trainer.heads import CLASSIFICATION, REGRESSION, Head, HeadTotals

    heads = [Head("a", CLASSIFICATION, vocabulary=["x", "y"]), Head("b", REGRESSION, std=2.0)]
    targets = {"a": tf.constant([0, 1]), "b": tf.constant([1.0, 3.0])}
    outputs = {"a": tf.constant([[0.9, 0.1], [0.2, 0.8]]), "b": tf.constant([[1.0], [1.0]])}
    plain = HeadTotals(heads)
    plain.add(targets, outputs)
    assert "weighted_loss" not in plain.metrics()
    heads[1].weight = 0.25
    weighted = HeadTotals(heads)
    weighted.add(targets, outputs)
    m = weighted.metrics()
    assert m["loss"] == pytest.approx(m["a_loss"] + m["b_loss"]) and m["b_loss"] == pytest.approx(0.5)
    assert m["weighted_loss"] == pytest.approx(m["a_loss"] + 0.25 * m["b_loss"])


def test_per_optimizer_keys_survive_the_components_json_round_trip():
    """The Trainer component gets the trainer section as JSON: unset per-optimizer keys (null
    there) still take the trainer-level values."""
    from trainer.optimization import optimizer_schedules

    config = TrainerConfig(learning_rate=0.01, optimizers={"discriminator": {"learning_rate": 0.004}})
    config = TrainerConfig.model_validate_json(config.model_dump_json())
    rates = optimizer_schedules(config, ["generator", "discriminator"], 100)
    assert float(rates["generator"](0)) == pytest.approx(0.01)
    assert float(rates["discriminator"](0)) == pytest.approx(0.004)


NO_ENCODER_LAYER = '''
import keras
from trainer.features import TabularEncoder


def build_model(ctx):
    inputs = ctx.inputs()
    numbers = {k: v for k, v in ctx.stats.numbers.items() if k in ctx.kinds}
    strings = {k: v for k, v in ctx.stats.strings.items() if k in ctx.kinds}
    x = TabularEncoder(numbers, strings, name="features")(inputs)  # not named "encoder"
    return keras.Model(inputs, {h.name: h.output_layer(keras.layers.Dense(8)(x)) for h in ctx.heads})
'''


def test_auto_xla_falls_back_when_strings_cannot_stay_out_of_it(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr("trainer.speed.XLA_CPU_MIN_STEPS", 1)  # a run long enough for XLA
    from tests.conftest import REPO
    from trainer.csv_examples import csv_to_tfrecords

    splits = csv_to_tfrecords(str(REPO / "data" / "penguins.csv"), str(tmp_path / "data"))
    module = tmp_path / "no_encoder.py"
    module.write_text(NO_ENCODER_LAYER)
    config = TrainerConfig(module_file=str(module), epochs=1, max_steps=2)
    with caplog.at_level(logging.INFO, logger="loopline.trainer"):
        assert train(config, *splits, "species").steps == 2
    assert "trainer.jit_compile=auto: XLA off (trainer.jit_compile: XLA cannot compile the string features" in caplog.text
    with pytest.raises(ValueError, match="no single 'encoder' layer"):
        train(config.model_copy(update={"jit_compile": True}), *splits, "species")


def test_op_determinism_ends_with_the_training_that_asked_for_it(tmp_path):
    """Op determinism is process-wide: left on, it breaks a later training in the same process
    (e.g. XLA has no deterministic MaxPool gradient)."""
    from tensorflow.python.framework import config as tf_config

    from trainer.loop import _configure_runtime, _reset_runtime

    config = TrainerConfig(deterministic=True)
    _configure_runtime(config)
    assert tf_config.is_op_determinism_enabled()
    _reset_runtime(config)
    assert not tf_config.is_op_determinism_enabled()
