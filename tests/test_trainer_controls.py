"""Each control of the training step takes effect: every test here fails if its control were a
no-op (small data, a few steps each)."""
from __future__ import annotations

import logging
import math
import re

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import REPO
from tests.trainer_data import read_events, regression_splits, trained_rows
from trainer.csv_examples import csv_to_tfrecords
from tests.trainer_modules import Recorder, built, write_module
from trainer import optimization
from trainer.config import TrainerConfig
from trainer.loop import train


@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    return regression_splits(tmp_path_factory.mktemp("regression"))


@pytest.fixture(scope="module")
def penguins(tmp_path_factory):
    return csv_to_tfrecords(str(REPO / "data" / "penguins.csv"), str(tmp_path_factory.mktemp("penguins")))


def weights(result):
    return [np.asarray(w) for w in result.model.get_weights()]


def layer_weights(model, name):
    return [np.asarray(w) for w in model.get_layer(name).get_weights()]


def trained_and_initial(module_path):
    """The trained model of the latest run (its first build) and its initial weights by layer."""
    model, initial = built(module_path)[-2]
    return model, initial


def test_accumulated_batches_equal_one_step_on_the_larger_batch(regression):
    base = TrainerConfig(epochs=1, max_steps=3, seed=4, deterministic=True, learning_rate=0.02)
    accumulated = train(base.model_copy(update={"batch_size": 32, "grad_accum_steps": 4}), *regression, "target")
    large = train(base.model_copy(update={"batch_size": 128}), *regression, "target")
    small = train(base.model_copy(update={"batch_size": 32}), *regression, "target")
    for a, b in zip(weights(accumulated), weights(large), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # Without accumulation the same steps see a quarter of the rows and end elsewhere.
    assert max(np.abs(a - b).max() for a, b in zip(weights(small), weights(large))) > 1e-3


def spy_on_applied_gradients(monkeypatch) -> tf.Variable:
    """The largest global norm of the gradients the (inner, unscaled) optimizer was given."""
    largest = tf.Variable(0.0, trainable=False)
    real = optimization.make_optimizer

    def make_optimizer(config, schedule, variables):
        optimizer = real(config, schedule, variables)
        target = optimization.inner(optimizer)
        apply = target.apply

        def spying_apply(gradients, trainable_variables=None):
            largest.assign(tf.maximum(largest, tf.linalg.global_norm(list(gradients))))
            return apply(gradients, trainable_variables)

        target.apply = spying_apply
        return optimizer

    monkeypatch.setattr(optimization, "make_optimizer", make_optimizer)
    return largest


@pytest.mark.parametrize("precision", ["float32", "mixed_float16"])
def test_clip_norm_bounds_the_applied_gradient(regression, monkeypatch, precision):
    """float16: the loop clips the scaled gradients at clip_norm * scale, so the unscaled ones the
    optimizer applies have norm clip_norm (not clip_norm / scale)."""
    largest = spy_on_applied_gradients(monkeypatch)
    recorder = Recorder()
    # The network alone: a fitted linear part leaves it gradients under the bound.
    config = TrainerConfig(epochs=1, max_steps=6, learning_rate=0.01, clip_norm=0.05, precision=precision,
                           linear_part=False)
    train(config, *regression, "target", metric_sinks=[recorder])
    assert max(recorder.series("grad_norm")) > 0.5  # the raw gradients were well above the bound
    assert float(largest.numpy()) == pytest.approx(0.05, rel=1e-4)


def test_model_losses_move_the_weights_as_the_penalty_says(regression, tmp_path):
    module = write_module(tmp_path)
    result = train(TrainerConfig(module_file=module, epochs=1, max_steps=5, learning_rate=0.01), *regression, "target")
    # The penalty is the probe weight itself: gradient 1, so each Adam step moves it by -lr.
    assert float(result.model.get_layer("probe").probe.numpy()) == pytest.approx(-0.05, rel=1e-4)


def test_lr_multipliers_freeze_and_double(regression, tmp_path):
    module = write_module(tmp_path)
    config = TrainerConfig(module_file=module, epochs=1, learning_rate=0.01, seed=2, deterministic=True)

    train(config.model_copy(update={"max_steps": 5, "lr_multipliers": {"hidden_0": 0.0}}), *regression, "target")
    model, initial = trained_and_initial(module)
    start = dict(zip([w.path for w in model.weights], initial))
    for variable in model.trainable_weights:
        same = np.array_equal(variable.numpy(), start[variable.path])
        assert same == variable.path.startswith("hidden_0"), variable.path  # only hidden_0 is frozen

    def first_update(factor):
        train(config.model_copy(update={"max_steps": 1, "lr_multipliers": {"hidden_0": factor}}), *regression, "target")
        model, initial = trained_and_initial(module)
        return {w.path: w.numpy() - i for w, i in zip(model.weights, initial)}

    once, doubled = first_update(1.0), first_update(2.0)
    np.testing.assert_allclose(doubled["hidden_0/kernel"], 2 * once["hidden_0/kernel"], rtol=1e-4, atol=1e-8)
    assert np.abs(once["hidden_0/kernel"]).max() > 1e-3
    np.testing.assert_allclose(doubled["hidden_1/kernel"], once["hidden_1/kernel"], rtol=1e-5, atol=1e-8)


PENGUIN_HEADS = '''
LABELS = {"species": "classification", "body_mass_g": "regression"}


def loss_weights(step):
    return {"species": 1.0, "body_mass_g": 0.0}
'''


def test_zero_loss_weight_leaves_the_head_untrained(penguins, tmp_path):
    module = write_module(tmp_path, PENGUIN_HEADS)
    train(TrainerConfig(module_file=module, epochs=1, max_steps=5, learning_rate=0.01), *penguins, "species")
    model, initial = trained_and_initial(module)
    start = dict(zip([w.path for w in model.weights], initial))
    for variable in model.get_layer("body_mass_g_standardized").weights:
        np.testing.assert_array_equal(variable.numpy(), start[variable.path])
    assert not np.array_equal(model.get_layer("species").kernel.numpy(), start["species/kernel"])


OVERFLOW_AT_3 = '''

def loss_weights(step):
    # A weight this large overflows float16's gradients (x the loss scale) at step 3 only.
    return {"target": tf.where(tf.equal(step, 3), 1e8, 1.0)}
'''


def test_float16_overflow_halves_the_scale_and_skips_that_update(regression, tmp_path):
    module = write_module(tmp_path, OVERFLOW_AT_3)
    recorder = Recorder(module)
    config = TrainerConfig(module_file=module, epochs=1, max_steps=5, learning_rate=0.01, steps_per_loop=1,
                           precision="mixed_float16")
    train(config, *regression, "target", metric_sinks=[recorder])
    scales, moved = recorder.series("loss_scale"), recorder.probe_steps()
    assert scales[3] == scales[2] / 2  # logged before each step: step 4 runs on half step 3's scale
    assert moved[2] == 0.0  # step 3's update was skipped...
    assert moved[1] == pytest.approx(-0.01, rel=1e-3) and moved[3] == pytest.approx(-0.01, rel=1e-3)  # ...not the others


def expected_rates(schedule: str, steps: int) -> list[float]:
    """The rates each schedule should give steps 1..steps, written out from their formulas."""
    lr = 0.01
    if schedule == "constant":
        return [lr] * steps
    if schedule == "cosine":  # warm-up over 4 steps from 0, then cosine decay over 4
        return [lr * k / 4 if k <= 4 else lr * 0.5 * (1 + math.cos(math.pi * (k - 4) / 4)) for k in range(1, steps + 1)]
    if schedule == "exponential":  # x0.5 every 2 steps
        return [lr * 0.5 ** (k / 2) for k in range(1, steps + 1)]
    low = 0.002  # triangular: 4-step cycles from 0.002 up to 0.01 and back
    return [low + (lr - low) * (1 - abs(2 * ((k % 4) / 4) - 1)) for k in range(1, steps + 1)]


@pytest.mark.parametrize("schedule", ["constant", "cosine", "exponential", "triangular"])
def test_each_schedule_is_the_rate_the_optimizer_applied(regression, tmp_path, schedule):
    module = write_module(tmp_path)
    recorder = Recorder(module)
    config = TrainerConfig(module_file=module, epochs=1, max_steps=7, learning_rate=0.01, steps_per_loop=1,
                           lr_schedule=schedule, warmup_steps=4 if schedule == "cosine" else 0, decay_steps=2 if
                           schedule == "exponential" else 4, decay_rate=0.5, cycle_steps=4, min_learning_rate=0.002)
    train(config, *regression, "target", metric_sinks=[recorder])
    expected = expected_rates(schedule, 7)
    np.testing.assert_allclose(recorder.series("learning_rate"), expected, rtol=1e-5, atol=1e-9)  # logged
    np.testing.assert_allclose([-d for d in recorder.probe_steps()], expected, rtol=1e-3, atol=1e-7)  # applied


NAN_AT_5_AND_9 = '''

def loss_weights(step):
    return {"target": tf.where(tf.equal(step, 5) | tf.equal(step, 9), float("nan"), 1.0)}
'''


def test_nan_guard_names_the_first_bad_step_and_applies_nothing_from_it(regression, tmp_path):
    """32 steps per call: steps 5 and 9 are non-finite; the error names 5 and the weights are
    those after step 4."""
    module = write_module(tmp_path, NAN_AT_5_AND_9)
    config = TrainerConfig(module_file=module, epochs=1, batch_size=8, learning_rate=0.01, seed=6,
                           deterministic=True, steps_per_loop=32)
    with pytest.raises(FloatingPointError, match=r"non-finite loss or gradient at step 5\b"):
        train(config, *regression, "target")
    halted = [w.numpy() for w in built(module)[-2][0].weights]
    four = train(config.model_copy(update={"max_steps": 4}), *regression, "target")
    four_model = built(module)[-2][0]
    for a, b in zip(halted, [w.numpy() for w in four_model.weights], strict=True):
        np.testing.assert_array_equal(a, b)
    assert four.steps == 4


def test_resume_false_sets_old_checkpoints_aside_and_starts_at_zero(regression, tmp_path, caplog):
    config = TrainerConfig(epochs=2, seed=3, deterministic=True, checkpoint_every_steps=5)
    train(config.model_copy(update={"seed": 1, "max_steps": 10}), *regression, "target", work_dir=str(tmp_path))
    straight = train(config, *regression, "target")
    with caplog.at_level(logging.INFO, logger="loopline.trainer"):
        fresh = train(config.model_copy(update={"resume": False}), *regression, "target", work_dir=str(tmp_path))
    assert "resumed from step" not in caplog.text
    moved = re.search(r"moved the old checkpoints \(latest ckpt-10\) aside to (\S+); starting at step 0", caplog.text)
    assert moved and tf.io.gfile.exists(moved.group(1) + "/ckpt-10.index")
    # Started from the seed-3 initial weights, not from the seed-1 run's checkpoint.
    assert fresh.steps == straight.steps == 2 * (trained_rows(regression[0]) // 32)
    assert fresh.exported == straight.exported
    for a, b in zip(weights(straight), weights(fresh)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith(f"-{straight.steps}")


def test_epoch_log_shows_the_epoch_mean_train_loss(regression, caplog):
    recorder = Recorder()
    config = TrainerConfig(epochs=1, steps_per_loop=4, learning_rate=0.05, validation_fraction=0)  # 512 rows: 16 steps
    with caplog.at_level(logging.INFO, logger="loopline.trainer"):
        train(config, *regression, "target", metric_sinks=[recorder])
    losses = recorder.series("loss")  # one per call of 4 steps, 16 steps in the epoch
    assert len(losses) == 4 and losses[0] > 1.5 * losses[-1]
    shown = float(re.search(r"epoch 1/1 step 16/16 train_loss=(\S+)", caplog.text).group(1))
    assert shown == pytest.approx(np.mean(losses), rel=1e-3)


COUNT_EVAL_TRACES = '''
TRACES = []


class Count(keras.layers.Layer):
    def call(self, x, training=None):
        if training is False and not tf.executing_eagerly():
            TRACES.append(1)
        return x


def build_model(ctx):
    inputs = ctx.inputs()
    x = keras.layers.Dense(8, activation="relu", name="hidden_0")(Count()(ctx.encoder()(inputs)))
    return keras.Model(inputs, {h.name: h.output_layer(x) for h in ctx.heads})
'''


def test_evaluation_traces_once(regression, tmp_path):
    module = write_module(tmp_path, COUNT_EVAL_TRACES)
    from trainer.model import load_module

    load_module(module).TRACES.clear()
    # An evaluation of the held-out rows every 4 steps and one of the eval split (the weights exported):
    # their elements have the same spec, so one traced step serves both.
    train(TrainerConfig(module_file=module, epochs=2, eval_every_steps=4), *regression, "target")
    assert load_module(module).TRACES == [1]


LOSS_DEPENDENT_ZERO = '''

def loss_weights(step, losses):
    return {"target": 0.0 * losses["target"]}  # a weight computed from this batch's losses
'''


def test_loss_weights_get_the_batch_losses(regression, tmp_path):
    """A (step, losses) hook weighting the only head by 0: only the probe's own penalty trains."""
    module = write_module(tmp_path, LOSS_DEPENDENT_ZERO)
    train(TrainerConfig(module_file=module, epochs=1, max_steps=3), *regression, "target")
    model, initial = trained_and_initial(module)
    for variable, start in zip(model.weights, initial):
        if variable.path.startswith(("hidden_", "target")):
            np.testing.assert_array_equal(variable.numpy(), start, err_msg=variable.path)
    assert model.get_layer("probe").probe.numpy() < 0


OVERRIDE = '''

from trainer.loop import head_losses


def build_optimizers(ctx, learning_rate):
    return {"model": keras.optimizers.Adam(learning_rate)}


def loss_of(model, heads, targets, outputs, global_batch_size):
    losses = head_losses(heads, targets, outputs, global_batch_size)
    return tf.add_n(list(losses.values()) + [tf.cast(extra, tf.float32) for extra in model.losses])


def train_step(ctx, features, targets):
    model = ctx.models["model"]

    def loss_fn(features, targets):
        loss = loss_of(model, ctx.heads, targets, model(features, training=True), ctx.global_batch_size)
        return loss * tf.where(tf.equal(ctx.step, NAN_AT or -1), float("nan"), 1.0)

    return {"loss": ctx.minimize("model", loss_fn)}
'''


@pytest.mark.parametrize("controls", [
    {"grad_accum_steps": 2, "clip_norm": 0.5, "lr_multipliers": {"hidden_0": 0.5}, "ema_decay": 0.9},
    {"precision": "mixed_float16", "clip_norm": 0.5},
], ids=["accumulate_clip_multiply_ema", "float16_clip"])
def test_train_step_override_keeps_the_controls(regression, tmp_path, controls):
    """The same controls through the StepContext helpers train exactly as the loop's own step."""
    module = write_module(tmp_path, "NAN_AT = None\n" + OVERRIDE)
    config = TrainerConfig(epochs=1, max_steps=6, seed=8, deterministic=True, learning_rate=0.02, jit_compile=False,
                           steps_per_loop=3, histogram_every_steps=3, **controls)
    own = train(config.model_copy(update={"module_file": write_module(tmp_path, name="plain.py")}), *regression,
                "target")
    override = train(config.model_copy(update={"module_file": module}), *regression, "target",
                     work_dir=str(tmp_path / "w"))
    for a, b in zip(weights(own), weights(override), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    tags = read_events(tmp_path / "w" / "tensorboard" / "train")
    assert "grad_norm/model" in tags and "weights/hidden_0/kernel" in tags


def test_train_step_override_nan_guard_stops_at_the_first_bad_step(regression, tmp_path):
    module = write_module(tmp_path, "NAN_AT = 5\n" + OVERRIDE)
    config = TrainerConfig(module_file=module, epochs=1, batch_size=8, seed=6, deterministic=True, steps_per_loop=32)
    with pytest.raises(FloatingPointError, match=r"non-finite loss or gradient at step 5\b"):
        train(config, *regression, "target")
    halted = [w.numpy() for w in built(module)[-2][0].weights]
    train(config.model_copy(update={"max_steps": 4}), *regression, "target")
    for a, b in zip(halted, [w.numpy() for w in built(module)[-2][0].weights], strict=True):
        np.testing.assert_array_equal(a, b)


DIRECT_APPLY = '''

def build_optimizers(ctx, learning_rate):
    return {"model": keras.optimizers.Adam(learning_rate)}


def train_step(ctx, features, targets):
    model = ctx.models["model"]
    with tf.GradientTape() as tape:
        loss = tf.add_n([tf.cast(extra, tf.float32) for extra in model(features, training=True) and model.losses])
    ctx.optimizers["model"].apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return {"loss": loss}
'''


def test_train_step_override_that_bypasses_the_helpers_refuses_their_keys(regression, tmp_path):
    module = write_module(tmp_path, DIRECT_APPLY)
    config = TrainerConfig(module_file=module, epochs=1, max_steps=2, clip_norm=1.0)
    with pytest.raises(ValueError, match=r"updates \['model'\] without ctx.apply or ctx.minimize, so trainer.clip_norm "
                                         r"cannot apply"):
        train(config, *regression, "target")
    train(config.model_copy(update={"clip_norm": None}), *regression, "target")  # nothing to lose: it runs


PYTHON_IF_ON_TENSORS = '''

def loss_weights(step):
    if step >= 3:  # a Python `if` on a tensor: autograph makes it a tf.cond, as in any tf.function
        return {"target": 0.0}
    return {"target": 1.0}


def build_metrics(ctx):
    def select(targets, outputs):
        predicted = outputs["target"]
        if tf.reduce_mean(predicted) > 1e9:  # never: only the graph's tf.cond takes it
            predicted = predicted * 0.0
        return targets["target"], predicted

    return {"target_mse": (keras.metrics.MeanSquaredError(), select)}
'''


def test_the_modules_hooks_are_converted_by_autograph_though_the_loops_own_step_is_not(regression, tmp_path):
    """loopline's step and evaluation are traced without autograph; the module's loss_weights and
    its metrics' select still run Python `if`s on tensors (unconverted, tracing would refuse them)."""
    module = write_module(tmp_path, "import keras\n" + PYTHON_IF_ON_TENSORS)
    recorder = Recorder(module)
    config = TrainerConfig(module_file=module, epochs=1, max_steps=5, learning_rate=0.01, steps_per_loop=1)
    result = train(config, *regression, "target", metric_sinks=[recorder])
    loss, target_loss, probe = recorder.series("loss"), recorder.series("loss/target"), recorder.probe
    assert all(value > 0.05 for value in target_loss)  # the head's own loss, unweighted, at every step
    assert loss[0] == pytest.approx(target_loss[0], abs=1e-3)  # weight 1 (the probe's term is 0 at step 1)
    # From step 3 the head weighs 0: what is left is the probe's own loss (its value before the step).
    assert loss[2:] == pytest.approx([probe[s - 1] for s in sorted(probe)[2:]], abs=1e-5)
    assert result.metrics["target_mse"] > 0


def test_categorical_features_reach_the_encoder_and_bad_names_are_refused(penguins):
    """trainer.categorical_features: a number column (penguins' year: 2007-2009) is one-hot in the
    trained model's encoder, not standardized; a column that is no feature, or text, is refused by name."""
    config = TrainerConfig(epochs=1, max_steps=2, categorical_features=["year"])
    encoder = train(config, *penguins, "species").model.get_layer("encoder")
    assert encoder.categorical == ["year"] and sorted(encoder.strings["year"]) == ["2007", "2008", "2009"]
    assert "year" not in encoder.numbers
    for name, message in (("yeer", "'yeer' is not a feature column"), ("species", "'species' is not a feature column"),
                          ("island", "'island' is string; only number columns")):
        with pytest.raises(ValueError, match=f"trainer.categorical_features: {message}"):
            train(config.model_copy(update={"categorical_features": [name]}), *penguins, "species")
