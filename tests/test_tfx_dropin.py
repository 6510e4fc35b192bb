"""TFX's penguin example (tests/data/tfx_penguin/, unchanged) through loopline: its
preprocessing_fn in loopline's Transform step, in one real LocalDagRunner run shared by the tests."""
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import REPO, make_config

PENGUIN = REPO / "tests" / "data" / "tfx_penguin"
MODULE_FILE = PENGUIN / "penguin_utils_keras.py"
FEATURES = ["culmen_length_mm", "culmen_depth_mm", "flipper_length_mm", "body_mass_g"]


@pytest.fixture(scope="module")
def penguin_run(tmp_path_factory):
    """The penguin example's data and module file, with config keys only; yields (config, summary)."""
    from pipeline.local_runner import run_local

    config = make_config(tmp_path_factory.mktemp("tfx_penguin"),
                         f"data.path={PENGUIN / 'data' / 'labelled' / 'penguins_processed.csv'}",
                         f"transform.module_file={MODULE_FILE}", "trainer.module_file=null", "mlflow.enabled=false")
    return config, run_local(config)


def transform_outputs(config, summary) -> dict:
    """The Transform's output artifacts in ML Metadata, by type name."""
    from pipeline.run_metadata import node_outputs, open_store

    state, outputs = node_outputs(open_store(config, read_only=True), summary.run_id, config.pipeline.name, "Transform")
    assert state == "COMPLETE"
    return outputs


def read_examples(pattern: str, feature_spec: dict) -> dict:
    files = tf.io.gfile.glob(pattern)
    assert files, pattern
    records = tf.data.TFRecordDataset(files, compression_type="GZIP" if files[0].endswith(".gz") else None)
    return {name: np.concatenate([batch[name].numpy().reshape(-1) for batch in
                                  records.batch(1000).map(lambda r: tf.io.parse_example(r, feature_spec))])
            for name in feature_spec}


@pytest.mark.slow
def test_the_transform_graph_and_transformed_examples_are_in_ml_metadata(penguin_run):
    """preprocessing_fn's tft.scale_to_z_score was analyzed over the train split: its transformed
    train features have mean 0 and deviation 1 (the raw ones are in [0, 1]); the label is passed
    through; the eval split went through the same transform function (no skew)."""
    import tensorflow_transform as tft

    config, summary = penguin_run
    assert summary.executions["Transform"] == "COMPLETE"
    outputs = transform_outputs(config, summary)
    graph = tft.TFTransformOutput(outputs["TransformGraph"].uri)
    examples = outputs["Examples"]
    assert examples.properties["split_names"].string_value == '["train", "eval"]'
    spec = graph.transformed_feature_spec()
    assert set(spec) == {f"{name}_xf" for name in FEATURES + ["species"]}

    train = read_examples(f"{examples.uri}/Split-train/transformed_examples-*.gz", spec)
    raw_train = read_examples(f"{config.pipeline.root}/tfx/CsvExampleGen/examples/*/Split-train/*",
                              graph.raw_feature_spec())
    for name in FEATURES:
        assert raw_train[name].mean() > 0.2  # raw: scaled to [0, 1] upstream
        assert abs(train[f"{name}_xf"].mean()) < 1e-4 and abs(train[f"{name}_xf"].std() - 1) < 1e-3
    np.testing.assert_array_equal(np.sort(train["species_xf"]), np.sort(raw_train["species"]))

    raw_eval = read_examples(f"{config.pipeline.root}/tfx/CsvExampleGen/examples/*/Split-eval/*",
                             graph.raw_feature_spec())
    by_graph = graph.transform_raw_features({k: tf.constant(v.reshape(-1, 1)) for k, v in raw_eval.items()})
    written = read_examples(f"{examples.uri}/Split-eval/transformed_examples-*.gz", spec)
    for name in FEATURES:
        np.testing.assert_allclose(np.sort(written[f"{name}_xf"]), np.sort(by_graph[f"{name}_xf"].numpy().reshape(-1)),
                                   rtol=1e-5)


def test_a_module_file_without_the_function_is_named(tmp_path):
    from components.tfx_module_file import ModuleFileError, module_function

    module = tmp_path / "no_preprocessing.py"
    module.write_text("from tfx import v1 as tfx\n\ndef run_fn(fn_args):\n    pass\n")
    with pytest.raises(ModuleFileError, match=r"no_preprocessing\.py: has no function 'preprocessing_fn'"):
        module_function(str(module), "preprocessing_fn")
    assert module_function(str(module), "tuner_fn", required=False) is None
    assert callable(module_function(str(module), "run_fn"))  # `from tfx import v1` imported without TFDV


def test_transform_module_file_is_a_path_relative_to_the_config():
    config = make_config(REPO / "unused", "transform.module_file=tests/data/tfx_penguin/penguin_utils_keras.py")
    assert config.transform.module_file == str(MODULE_FILE)
    assert make_config(REPO / "unused").transform.module_file is None  # off by default
