"""TFX's MNIST example (tests/data/tfx_mnist/, unchanged): a second TFX module file whose serving
signature holds the transform graph, on TFRecord input, through `loopline run` with config keys
only; the pushed model is served over gRPC on raw tf.Examples. One real `loopline run` (a child
process) shared by the tests."""
import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import REPO, loopline_run_child

MNIST = REPO / "tests" / "data" / "tfx_mnist"
MODULE_FILE = MNIST / "mnist_utils_native_keras.py"
DATA = MNIST / "data" / "mnist.tfrecord"


@pytest.fixture(scope="module")
def mnist_run(tmp_path_factory):
    """`loopline run` on the example's TFRecord file and module file; yields (config, summary)."""
    root = tmp_path_factory.mktemp("tfx_mnist")
    overrides = [f"data.path={DATA}", "data.format=tfrecord", "data.label=image_class",
                 f"transform.module_file={MODULE_FILE}", f"trainer.module_file={MODULE_FILE}",
                 "trainer.train_steps=100", "trainer.eval_steps=5", "serving.model_name=mnist"]
    return loopline_run_child(root, *overrides)


def test_the_example_files_are_tfx_s_bytes():
    """The README's hashes are the files' own: the module and data are TFX's, unedited."""
    readme = (MNIST / "README.md").read_text()
    listed = dict(re.findall(r"\| `([^`]+)` \| `[^`]+` \| `([0-9a-f]{64})` \|", readme))
    assert set(listed) == {"mnist_utils_native_keras.py", "mnist_utils_native_keras_base.py", "data/mnist.tfrecord"}
    for name, digest in listed.items():
        assert hashlib.sha256((MNIST / name).read_bytes()).hexdigest() == digest, name


def eval_records(config) -> tuple[list[bytes], np.ndarray]:
    """ExampleGen's eval split: serialized raw tf.Examples and their labels."""
    pattern = f"{config.pipeline.root}/tfx/CsvExampleGen/examples/*/Split-eval/*"
    records = [r.numpy() for r in tf.data.TFRecordDataset(tf.io.gfile.glob(pattern), compression_type="GZIP")]
    labels = tf.io.parse_example(records, {"image_class": tf.io.FixedLenFeature([], tf.int64)})["image_class"]
    return records, labels.numpy()


@pytest.mark.slow
def test_the_mnist_module_is_transformed_trained_evaluated_and_pushed(mnist_run):
    """Transform ran its preprocessing_fn, run_fn trained on its output, the Evaluator scored the
    pushed SavedModel (raw tf.Examples in: the transform graph is in its signature) and blessed it."""
    config, summary = mnist_run
    components = ("Transform", "Trainer", "Evaluator", "Pusher")
    assert {k: summary.executions[k] for k in components} == dict.fromkeys(components, "COMPLETE")
    assert summary.blessed is True
    records, labels = eval_records(config)
    logits = tf.saved_model.load(summary.pushed_path).signatures["serving_default"](
        examples=tf.constant(records))["output_0"].numpy()
    accuracy = float(np.mean(logits.argmax(axis=1) == labels))
    assert accuracy > 0.5  # ten classes: chance is 0.1
    from pipeline.run_metadata import node_outputs, open_store

    _, outputs = node_outputs(open_store(config, read_only=True), summary.run_id, config.pipeline.name, "Evaluator")
    recorded = outputs["ModelBlessing"].custom_properties["eval_image_class_accuracy"].double_value
    assert recorded == pytest.approx(accuracy, abs=1e-6)


@pytest.mark.slow
def test_the_run_fn_model_s_tflite_variants_are_dropped_with_the_reason_in_the_export_report(mnist_run):
    """The serving signature parses tf.Examples, which TFLite's builtin ops cannot: the configured
    variants (float32, dynamic_range) are dropped, each naming ParseExampleV2, in the report the
    Evaluator completes with its blessing; the run goes on, and nothing TFLite is pushed."""
    import json

    config, summary = mnist_run
    from pipeline.run_metadata import node_outputs, open_store

    _, outputs = node_outputs(open_store(config, read_only=True), summary.run_id, config.pipeline.name, "Evaluator")
    report = json.loads(Path(outputs["ModelBlessing"].uri, "export_report.json").read_text())
    assert [v["variant"] for v in report["tflite"]] == config.export.tflite_variants == ["float32", "dynamic_range"]
    for variant in report["tflite"]:
        assert variant["dropped"] and "ParseExampleV2" in variant["problems"][0], variant
    assert report["blessing"]["blessed"] is True
    assert not list(Path(summary.pushed_path).glob("*.tflite"))


@pytest.mark.slow
def test_the_served_mnist_model_answers_raw_examples_over_grpc_as_the_saved_model_does(mnist_run):
    from tests.serving_helpers import predict_examples

    config, summary = mnist_run
    records, _ = eval_records(config)
    records = records[:64]
    direct = tf.saved_model.load(summary.pushed_path).signatures["serving_default"](examples=tf.constant(records))
    answer = predict_examples(Path(config.pipeline.root), "mnist", records)
    assert answer.model_spec.version.value == int(summary.version)
    np.testing.assert_allclose(tf.make_ndarray(answer.outputs["output_0"]), direct["output_0"].numpy(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_the_run_fn_model_is_registered_in_mlflow_and_its_pyfunc_answers_as_the_saved_model(mnist_run):
    """The Registrar logs the run_fn's SavedModel as a pyfunc model over its tf.Example signature
    (raw feature columns in, the label left out) and registers the pushed version; loaded back
    through MLflow it answers what the SavedModel answers. The version's model card is pushed too."""
    import mlflow
    from mlflow.tracking import MlflowClient

    config, summary = mnist_run
    tracking_uri = f"sqlite:///{config.pipeline.root}/mlflow/mlflow.db"
    client = MlflowClient(tracking_uri)
    (version,) = client.search_model_versions(f"name='{config.mlflow.registered_model or config.serving.model_name}'")
    run = client.get_run(version.run_id)
    assert run.info.status == "FINISHED"
    records, _ = eval_records(config)
    records = records[:5]
    parsed = tf.io.parse_example(records, {"image_floats": tf.io.FixedLenFeature([784], tf.float32)})
    frame = __import__("pandas").DataFrame({"image_floats": list(parsed["image_floats"].numpy())})
    mlflow.set_tracking_uri(tracking_uri)
    answer = mlflow.pyfunc.load_model(f"models:/{version.name}/{version.version}").predict(frame)
    assert list(answer.columns) == [f"output_0_{i}" for i in range(10)]
    direct = tf.saved_model.load(summary.pushed_path).signatures["serving_default"](examples=tf.constant(records))
    np.testing.assert_allclose(answer.to_numpy(), direct["output_0"].numpy(), rtol=1e-5, atol=1e-5)
    card = Path(summary.pushed_path, "assets.extra", "model_card", "model_card.html").read_text()
    assert version.run_id in card
