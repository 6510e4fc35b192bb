"""The custom-loop trainer on small data: every control trains, combines and reports."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.trainer_data import points_splits, read_events, regression_splits, trained_rows
from trainer.config import TrainerConfig
from trainer.csv_examples import csv_to_tfrecords
from trainer.loop import train

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def penguins(tmp_path_factory):
    return csv_to_tfrecords(str(REPO / "data" / "penguins.csv"), str(tmp_path_factory.mktemp("penguins")))


@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    return regression_splits(tmp_path_factory.mktemp("regression"))


def weights(result):
    return [np.asarray(w) for w in result.model.get_weights()]


def test_penguins_multitask_module(penguins):
    config = TrainerConfig(module_file=str(REPO / "examples/penguins/model.py"), epochs=8, batch_size=16)
    result = train(config, *penguins, "species")
    assert [h.name for h in result.heads] == ["species", "body_mass_g"]
    assert "body_mass_g" not in result.kinds and "species" not in result.kinds
    assert result.metrics["species_accuracy"] > 0.85
    # Body mass spreads ~800 g; the regression head must beat predicting the mean.
    std = result.heads[1].std
    assert result.metrics["body_mass_g_rmse"] < 0.7 * std
    assert 0 < result.metrics["body_mass_g_mae"] < result.metrics["body_mass_g_rmse"] * 1.01
    assert all(w.dtype == np.float32 for w in weights(result))


def test_all_controls_combine_and_report(regression, tmp_path):
    config = TrainerConfig(
        epochs=3, batch_size=32, learning_rate=0.02, precision="mixed_bfloat16", grad_accum_steps=2,
        clip_norm=1.0, ema_decay=0.5, lr_schedule="cosine", warmup_steps=3, jit_compile=True,
        steps_per_loop=4, nan_policy="skip", lr_multipliers={"hidden_0": 0.5}, histogram_every_steps=5,
        eval_every_steps=4, early_stopping_metric="loss", early_stopping_patience=10,
    )
    result = train(config, *regression, "target", work_dir=str(tmp_path))
    assert result.steps == 3 * (trained_rows(regression[0]) // 32 // 2)  # the held-out rows are not trained on
    assert result.model.dtype_policy.name == "float32"
    assert all(w.dtype == np.float32 for w in weights(result))
    assert result.metrics["target_rmse"] < 1.5  # the label's std is ~2.7
    train_tags = read_events(tmp_path / "tensorboard" / "train")
    for tag in ("loss", "loss/target", "grad_norm", "learning_rate", "examples_per_sec", "skipped_steps",
                "grad_norm/hidden_0/kernel", "weights/hidden_0/kernel", "gradients/hidden_0/kernel"):
        assert tag in train_tags, tag
    lr = train_tags["learning_rate"]
    assert lr[0] < max(lr) and lr[-1] < max(lr)  # warm-up, then cosine decay
    assert "target_rmse" in read_events(tmp_path / "tensorboard" / "eval")
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith(f"-{result.steps}")


def test_float16_logs_loss_scale(regression, tmp_path):
    config = TrainerConfig(epochs=1, precision="mixed_float16", steps_per_loop=4)
    result = train(config, *regression, "target", work_dir=str(tmp_path))
    scales = read_events(tmp_path / "tensorboard" / "train")["loss_scale"]
    assert scales and all(s > 1 for s in scales)
    assert np.isfinite(result.metrics["loss"])


def test_ema_weights_are_evaluated_and_returned(regression):
    config = TrainerConfig(epochs=1, learning_rate=0.05, steps_per_loop=8)
    one_step = train(config.model_copy(update={"max_steps": 1}), *regression, "target")
    # The average starts at the weights after the first step; a decay this close to 1 keeps it there.
    frozen = train(config.model_copy(update={"ema_decay": 0.999999}), *regression, "target")
    for a, b in zip(weights(one_step), weights(frozen)):
        np.testing.assert_allclose(a, b, atol=1e-4)
    plain = train(config, *regression, "target")
    assert frozen.metrics["target_rmse"] > 1.5 * plain.metrics["target_rmse"]


def test_nan_guard_stops_naming_the_step_or_skips(regression, tmp_path):
    # A learning rate this large throws the weights out in the first update: step 2's loss overflows.
    diverging = TrainerConfig(epochs=1, learning_rate=1e37)
    with pytest.raises(FloatingPointError, match=r"non-finite loss or gradient at step 2\b"):
        train(diverging, *regression, "target")
    result = train(diverging.model_copy(update={"nan_policy": "skip"}), *regression, "target", work_dir=str(tmp_path / "w"))
    assert all(np.isfinite(w).all() for w in weights(result))
    assert sum(read_events(tmp_path / "w" / "tensorboard" / "train")["skipped_steps"]) > 0


def test_infinite_feature_values_count_as_missing(tmp_path, caplog):
    """One inf in a column must not poison its mean/std (every answer NaN): it reads as missing."""
    splits = regression_splits(tmp_path, inf_every=2)
    with caplog.at_level(logging.WARNING, logger="loopline.trainer"):
        result = train(TrainerConfig(epochs=2, validation_fraction=0), *splits, "target")  # statistics of all 512 rows
    assert "infinite values (counted as missing, like NaN): {'x0': 256}" in caplog.text
    assert np.isfinite(result.stats.numbers["x0"]).all() and result.stats.missing["x0"] == 256
    # nan_policy "stop" (the default) raised for no step, and the model learned from the other columns.
    assert np.isfinite(result.metrics["target_rmse"]) and result.metrics["target_rmse"] < 0.7 * result.heads[0].std
    rows = {f"x{i}": tf.constant([[np.inf], [-np.inf], [np.nan]]) if i == 0 else tf.zeros([3, 1]) for i in range(4)}
    answers = np.asarray(result.model(rows)["target"])
    assert np.isfinite(answers).all() and answers[0] == answers[1] == answers[2]


def test_seeded_deterministic_runs_are_identical(regression):
    config = TrainerConfig(epochs=1, max_steps=6, seed=7, deterministic=True, steps_per_loop=3)
    first, second = train(config, *regression, "target"), train(config, *regression, "target")
    for a, b in zip(weights(first), weights(second)):
        np.testing.assert_array_equal(a, b)
    other = train(config.model_copy(update={"seed": 8}), *regression, "target")
    assert not all(np.array_equal(a, b) for a, b in zip(weights(first), weights(other)))


@pytest.mark.parametrize("in_memory_mb", [512, 0], ids=["in_memory", "streamed"])
def test_resume_continues_exactly(regression, tmp_path, caplog, in_memory_mb):
    # The network alone: this target is linear, so with the linear part every evaluation is within
    # float noise of the others, and the interrupted run's own final evaluation (step 10, one the
    # straight run never makes) can be the best (tests/test_linear_part.py resumes at an epoch's end).
    config = TrainerConfig(epochs=2, seed=3, deterministic=True, checkpoint_every_steps=5, ema_decay=0.9,
                           input={"in_memory_mb": in_memory_mb}, linear_part=False)
    straight = train(config, *regression, "target")
    train(config.model_copy(update={"max_steps": 10}), *regression, "target", work_dir=str(tmp_path))
    with caplog.at_level(logging.INFO, logger="loopline.trainer"):
        resumed = train(config, *regression, "target", work_dir=str(tmp_path))
    assert "resumed from step 10" in caplog.text
    assert resumed.steps == straight.steps == 2 * (trained_rows(regression[0]) // 32)
    assert resumed.exported == straight.exported
    for a, b in zip(weights(straight), weights(resumed)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_unrolled_steps_train_like_single_steps(regression, monkeypatch):
    """Three steps per compiled call (and single ones for what is left) are the same steps: the
    learning rate and loss weights still see each step's number. Not unrolled, the step is traced
    once; unrolled by 3, four times (a block of three, and the single step)."""
    import trainer.steps

    config = TrainerConfig(epochs=2, seed=5, deterministic=True, jit_compile=True, steps_per_loop=7,
                           lr_schedule="cosine", warmup_steps=4, eval_every_steps=10)
    logged = {1: [], 3: []}
    traced = []
    build = trainer.steps.build_replica_step

    def counting(run):
        step = build(run)
        return lambda *args: traced.append(run.config.unroll_steps) or step(*args)

    monkeypatch.setattr(trainer.steps, "build_replica_step", counting)

    class Sink:
        def __init__(self, unroll):
            self.unroll = unroll

        def log(self, step, metrics):
            if "train/learning_rate" in metrics:
                logged[self.unroll].append((step, metrics["train/learning_rate"], metrics["train/loss"]))

        def close(self):
            pass

    single = train(config, *regression, "target", metric_sinks=[Sink(1)])
    unrolled = train(config.model_copy(update={"unroll_steps": 3}), *regression, "target", metric_sinks=[Sink(3)])
    assert unrolled.steps == single.steps == 2 * (trained_rows(regression[0]) // 32)
    assert traced.count(1) == 1 and traced.count(3) == 4, traced
    for a, b in zip(weights(single), weights(unrolled)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.array(logged[3]), np.array(logged[1]), rtol=1e-4)


def test_in_memory_stream_is_a_full_shuffle_per_epoch(regression):
    from trainer.features import compute_stats, infer_feature_kinds
    from trainer.inputs import column_batches, load_in_memory, parsed_batches, training_stream
    from trainer.model import make_head

    kinds = infer_feature_kinds(regression[0])
    stats = compute_stats(parsed_batches(regression[0], kinds), kinds)
    heads = [make_head("target", kinds["target"], stats)]

    def epochs(in_memory_mb, skip=0):
        config = TrainerConfig().input.model_copy(update={"in_memory_mb": in_memory_mb})
        columns = load_in_memory(regression[0], kinds, config, 64)
        assert (columns is not None) == bool(in_memory_mb)
        stream = training_stream(regression[0], kinds, heads, 64, config, seed=1, skip_batches=skip, columns=columns)
        targets = [t["target"].numpy() for _, t in stream.take(16 - skip)]
        return np.concatenate(targets).reshape(2 - skip // 8, 512)

    first, second = epochs(512)
    assert sorted(first) == sorted(second) == sorted(epochs(0).ravel()[:512])  # every row once per epoch
    assert not np.array_equal(first, second)  # reshuffled
    np.testing.assert_array_equal(epochs(512, skip=8)[0], second)  # resume skips into the same order
    # The statistics from the held columns are the ones a separate pass over the records gives.
    columns = load_in_memory(regression[0], kinds, TrainerConfig().input, 64)
    assert compute_stats(column_batches(columns), kinds) == stats


def test_streamed_stream_shuffles_windows_across_the_split_and_resumes_exactly(regression):
    """A split streamed in windows (shuffle_buffer 100 of 512 rows: 6 windows, the last short):
    every row once per epoch, windows mixed with one another, reshuffled each epoch, the same on
    every run, and a resume skips into the same order."""
    from trainer.config import InputConfig
    from trainer.features import compute_stats, infer_feature_kinds
    from trainer.inputs import parsed_batches as record_batches, training_stream
    from trainer.model import make_head

    kinds = infer_feature_kinds(regression[0])
    stats = compute_stats(record_batches(regression[0], kinds), kinds)
    heads = [make_head("target", kinds["target"], stats)]
    file_order = np.concatenate([b["target"][:, 0] for b in record_batches(regression[0], kinds)])
    config = InputConfig(in_memory_mb=0, shuffle_buffer=100)

    def epochs(skip=0):
        stream = training_stream(regression[0], kinds, heads, 64, config, seed=1, skip_batches=skip)
        return np.concatenate([t["target"].numpy() for _, t in stream.take(16 - skip)]).reshape(-1, 512)

    first, second = epochs()
    assert sorted(first) == sorted(second) == sorted(file_order)  # every row once per epoch
    assert not np.array_equal(first, second)  # reshuffled
    position = {value: i for i, value in enumerate(file_order)}
    for epoch in (first, second):  # not the windows one after another in file order
        windows = [position[v] // 100 for v in epoch]
        assert windows != sorted(windows)
    np.testing.assert_array_equal(np.stack([first, second]), epochs())  # the same on every run
    np.testing.assert_array_equal(epochs(skip=8)[0], second)  # resume skips into the same order


def test_one_pass_dataset_keeps_the_file_order_and_the_last_partial_batch(regression):
    """The eval split is parsed in chunks of whole batches and cut back: the same batches in order."""
    from trainer.features import compute_stats, infer_feature_kinds
    from trainer.inputs import make_dataset, parsed_batches
    from trainer.model import make_head

    kinds = infer_feature_kinds(regression[0])
    heads = [make_head("target", kinds["target"], compute_stats(parsed_batches(regression[0], kinds), kinds))]
    file_order = np.concatenate([b["target"][:, 0] for b in parsed_batches(regression[0], kinds)])
    batches = [t["target"].numpy() for _, t in make_dataset(regression[0], kinds, heads, 100)]
    assert [len(b) for b in batches] == [100] * 5 + [12]
    np.testing.assert_array_equal(np.concatenate(batches), file_order)


def test_a_bad_record_in_a_streamed_window_is_an_error_naming_the_feature(tmp_path):
    from tests.trainer_data import write_examples
    from trainer.config import InputConfig
    from trainer.features import FeatureStats
    from trainer.inputs import training_stream
    from trainer.model import make_head

    path = write_examples(tmp_path / "train.gz", {"x": np.arange(300, dtype=np.float32),
                                                  "target": np.ones(300, np.float32)})
    records = [r for r in tf.data.TFRecordDataset(path, "GZIP").as_numpy_iterator()]
    bad = tf.train.Example.FromString(records[250])
    bad.features.feature["x"].float_list.value.append(1.0)  # two values in a scalar column
    records[250] = bad.SerializeToString()
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for record in records:
            writer.write(record)
    kinds = {"x": "float32", "target": "float32"}
    heads = [make_head("target", "float32", FeatureStats(numbers={"target": (1.0, 1.0)}, count=300))]
    stream = training_stream(path, kinds, heads, 32, InputConfig(in_memory_mb=0, shuffle_buffer=100), seed=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"feature \W*x\W* \(float32\): an example holds more than 1 value"):
        for _ in stream.take(20):
            pass


def test_debug_mode_runs_the_step_eagerly(regression, tmp_path):
    module = tmp_path / "module.py"
    module.write_text(
        "import tensorflow as tf\nSEEN = []\n"
        "def loss_weights(step):\n    SEEN.append(tf.executing_eagerly())\n    return {}\n"
    )
    from trainer.model import load_module

    train(TrainerConfig(epochs=1, max_steps=2, debug=True, module_file=str(module)), *regression, "target")
    # Two steps, then the validation rows' evaluation's weighted_loss, the eval split's (of the
    # weights exported) and the final weights recorded for export.
    assert load_module(str(module)).SEEN == [True, True, True, True, True]
    assert not tf.executing_eagerly() or not tf.config.functions_run_eagerly()


def test_gan_two_optimizers_same_loop(tmp_path):
    splits = points_splits(tmp_path / "data")
    config = TrainerConfig(module_file=str(REPO / "examples/gan/model.py"), epochs=20, batch_size=64,
                           learning_rate=0.01, steps_per_loop=16)
    result = train(config, *splits, "unused", work_dir=str(tmp_path / "w"))
    generated = result.model(tf.random.normal([2000, 4], seed=1)).numpy()
    assert np.linalg.norm(generated.mean(axis=0) - np.array([3.0, -2.0])) < 1.0
    saved = {name for name, _ in tf.train.list_variables(tf.train.latest_checkpoint(str(tmp_path / "w" / "checkpoints")))}
    assert any(n.startswith("optimizer_generator") for n in saved)
    assert any(n.startswith("optimizer_discriminator") for n in saved)
    tags = read_events(tmp_path / "w" / "tensorboard" / "train")
    assert "generator_loss" in tags and "discriminator_loss" in tags


def test_jit_with_string_features_trains_like_the_eager_graph(penguins):
    """XLA takes no strings: the encoder runs in tf.data and the compiled step trains the rest.
    Same seed and data, so the weights match the uncompiled step's up to rounding."""
    config = TrainerConfig(epochs=1, steps_per_loop=4, input={"deterministic": True})
    plain = train(config, *penguins, "species")
    compiled = train(config.model_copy(update={"jit_compile": True}), *penguins, "species")
    assert compiled.steps == plain.steps
    for a, b in zip(plain.model.get_weights(), compiled.model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    assert compiled.metrics["species_accuracy"] == pytest.approx(plain.metrics["species_accuracy"], abs=0.01)


def test_uncertainty_weighting_learns_the_head_weights(penguins):
    """loss_weights(step, losses, model) reads trainable log-variances: training moves them (each
    weight towards 1 / its head's loss), and eval's weighted_loss uses the weights the model ended with."""
    config = TrainerConfig(module_file=str(REPO / "examples/uncertainty/model.py"), epochs=6, batch_size=16,
                           learning_rate=0.02, early_stopping_metric="weighted_loss", early_stopping_patience=10,
                           restore_best=False)  # the weights learned by the end, whichever epoch was best
    result = train(config, *penguins, "species")
    log_variances = result.model.get_layer("log_variances").log_variances.numpy()
    assert np.abs(log_variances).min() > 0.05  # both moved from their start at 0
    weights = np.exp(-log_variances)
    losses = np.array([result.metrics["species_loss"], result.metrics["body_mass_g_loss"]])
    # The head with the larger loss ends with the smaller weight.
    assert (weights[0] > weights[1]) == (losses[0] < losses[1])
    assert result.metrics["weighted_loss"] == pytest.approx(float(weights @ losses), rel=1e-5)
    assert result.metrics["loss"] == pytest.approx(float(losses.sum()), rel=1e-5)  # eval loss: unweighted
    # The export records the final weights, so the Evaluator's metrics (HeadTotals) give the same weighted_loss.
    assert [h.weight for h in result.heads] == pytest.approx(list(weights), rel=1e-5)
    assert result.metrics["species_accuracy"] > 0.8


def test_per_optimizer_settings_reach_the_modules_optimizers(tmp_path):
    splits = points_splits(tmp_path / "data", rows=256)
    gan = (REPO / "examples/gan/model.py").read_text()
    module = tmp_path / "gan_rates.py"
    module.write_text(gan + "\n_build = build_optimizers\nRATES = {}\n\n\ndef build_optimizers(ctx, learning_rate):\n"
                      "    optimizers = _build(ctx, learning_rate)\n"
                      "    RATES.update({k: float(o.learning_rate) for k, o in optimizers.items()})\n"
                      "    return optimizers\n")
    config = TrainerConfig(module_file=str(module), epochs=1, max_steps=2, batch_size=64, learning_rate=0.01,
                           optimizers={"discriminator": {"learning_rate": 0.004, "lr_schedule": "triangular",
                                                         "cycle_steps": 4, "min_learning_rate": 0.002}})
    train(config, *splits, "unused")
    from trainer.model import load_module

    # The generator keeps the trainer's constant 0.01; the discriminator's triangle starts at step 1's 0.003.
    assert load_module(str(module)).RATES == pytest.approx({"generator": 0.01, "discriminator": 0.003})
    with pytest.raises(ValueError, match=r"trainer.optimizers names \['critic'\]"):
        train(config.model_copy(update={"optimizers": {"critic": {"learning_rate": 0.1}}}), *splits, "unused")


def test_train_step_override_refuses_keys_it_cannot_apply(tmp_path):
    splits = points_splits(tmp_path / "data", rows=128)
    config = TrainerConfig(module_file=str(REPO / "examples/gan/model.py"), epochs=1, unroll_steps=4)
    with pytest.raises(ValueError, match=r"the module's train_step cannot be unrolled, so trainer.unroll_steps=4"):
        train(config, *splits, "unused")
