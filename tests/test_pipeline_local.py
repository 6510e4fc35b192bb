"""A real LocalDagRunner run on the bundled data: pushed, loadable, predicting; then cached."""
import os

import numpy as np
import pytest
import tensorflow as tf

from pipeline.local_runner import run_local

pytestmark = pytest.mark.slow


def penguin_example(**values) -> bytes:
    feature = {}
    for name, value in values.items():
        if isinstance(value, str):
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
        elif isinstance(value, int):
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        else:
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


GENTOO = dict(island="Biscoe", bill_length_mm=47.5, bill_depth_mm=14.2, flipper_length_mm=210, body_mass_g=4600, sex="female", year=2008)
ADELIE = dict(island="Torgersen", bill_length_mm=39.1, bill_depth_mm=18.7, flipper_length_mm=181, body_mass_g=3750, sex="male", year=2007)


def test_run_pushes_a_servable_model(pipeline_run):
    config, summary = pipeline_run
    assert summary.version is not None
    assert summary.pushed_path == os.path.join(config.pipeline.root, "serving", "penguins", summary.version)
    assert os.path.isfile(os.path.join(summary.pushed_path, "saved_model.pb"))
    assert summary.metrics["species_accuracy"] > 0.8
    # The default module is multi-task: body mass is a second head (regression), not an input.
    assert summary.metrics["body_mass_g_rmse"] < 800  # grams; the training split's std is ~800
    assert set(summary.executions) == {
        "CsvExampleGen", "StatisticsGen", "SchemaGen", "ExampleValidator", "DataGate", "Trainer", "Evaluator", "Pusher",
        "BaselineRecorder", "ServingConfigs", "Registrar"}
    # Each component's wall time, from ML Metadata, is in the summary (which one is longest depends
    # on the machine's load, so no order is asserted): every component that ran took some time.
    assert set(summary.seconds) == set(summary.executions)
    assert all(seconds > 0 for seconds in summary.seconds.values()), summary.seconds
    time_line = next(line for line in summary.lines() if line.startswith("time       CsvExampleGen "))
    assert time_line.endswith(f"(components total {sum(summary.seconds.values()):.1f}s)")
    assert summary.blessed is True

    loaded = tf.saved_model.load(summary.pushed_path)
    serve = loaded.signatures["serving_default"]
    out = serve(inputs=tf.constant([penguin_example(**GENTOO), penguin_example(**ADELIE)]))
    classes = out["classes"].numpy().astype(str)
    predicted = classes[np.arange(2), out["scores"].numpy().argmax(axis=1)]
    assert list(predicted) == ["Gentoo", "Adelie"]
    np.testing.assert_allclose(out["scores"].numpy().sum(axis=1), 1.0, rtol=1e-5)


def test_the_summary_names_the_weights_exported_and_the_trivial_floor(pipeline_run):
    """The default module on the auto metric: the best species_loss epoch is exported, and each head
    beat the trivial model."""
    config, summary = pipeline_run
    exported = summary.exported
    assert exported["metric"] == "species_loss" and exported["restored"] is True
    assert 1 <= exported["epoch"] <= config.trainer.epochs and exported["split"] in ("validation", "eval")
    weights = next(line for line in summary.lines() if line.startswith("weights    "))
    assert f"epoch {exported['epoch']}, step {exported['step']}: the best {exported['split']} species_loss" in weights
    floors = [r for r in summary.blessing_reasons if "for the trivial model" in r]
    assert [r.split()[0] for r in floors] == ["species_loss", "body_mass_g_loss"]  # every head, none FAILED


def test_missing_values_are_served(pipeline_run):
    _, summary = pipeline_run
    serve = tf.saved_model.load(summary.pushed_path).signatures["serving_default"]
    # A row with every measurement missing (two such rows are in the data) still gets scores.
    out = serve(inputs=tf.constant([penguin_example(island="Torgersen", year=2007)]))
    assert np.isfinite(out["scores"].numpy()).all()


def test_predict_raw_matches_serving_default(pipeline_run):
    _, summary = pipeline_run
    loaded = tf.saved_model.load(summary.pushed_path)
    raw = loaded.signatures["predict_raw"]
    features = {k: tf.constant([[v]], tf.string if isinstance(v, str) else tf.float32)
                for k, v in ADELIE.items() if k != "body_mass_g"}  # a label of the default module
    from_raw = raw(**features)["scores"].numpy()
    from_examples = loaded.signatures["serving_default"](inputs=tf.constant([penguin_example(**ADELIE)]))["scores"].numpy()
    np.testing.assert_allclose(from_raw, from_examples, atol=1e-6)


def test_second_run_reuses_cached_components(pipeline_run):
    config, first = pipeline_run
    second = run_local(config)
    # ML Metadata records each execution of the new run as CACHED: nothing re-ran.
    assert set(second.executions) == set(first.executions)
    assert set(second.executions.values()) == {"CACHED"}
    assert second.version == first.version
    assert os.path.isfile(os.path.join(second.pushed_path, "saved_model.pb"))
