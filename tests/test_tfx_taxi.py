"""TFX's Chicago taxi example (tests/data/tfx_taxi/, unchanged): a binary classifier answering one
sigmoid column, evaluated as TFX's pipeline evaluates it (TFMA's label_key, preprocessing
function and metrics_specs, as config keys). One real `loopline run` (a child process)."""
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import REPO, loopline_run_child

TAXI = REPO / "tests" / "data" / "tfx_taxi"
MODULE_FILE = TAXI / "taxi_utils_native_keras.py"
# TFX's taxi_pipeline_native_keras.py eval_config, as YAML flow.
METRICS_SPECS = ("[{metrics: [{class_name: BinaryAccuracy, threshold: {value_threshold: {lower_bound: {value: 0.6}}, "
                 "change_threshold: {direction: HIGHER_IS_BETTER, absolute: {value: -1e-10}}}}, {class_name: AUC}]}]")


@pytest.fixture(scope="module")
def taxi_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfx_taxi")
    # TFX's pipeline trains 1,000 steps and evaluates 150 (TrainArgs, EvalArgs): the same here.
    # The train/eval drift gate is off: the data's heavy tails (trip_miles up to 1,710 in one split)
    # put its approximate Jensen-Shannon divergence over 0.25 on a random split; TFX does not gate.
    overrides = [f"data.path={TAXI / 'data' / 'data.csv'}", "data.label=tips", "validation.warn_only=true",
                 f"transform.module_file={MODULE_FILE}", f"trainer.module_file={MODULE_FILE}",
                 "trainer.train_steps=1000", "trainer.eval_steps=150", "evaluator.label_key=tips_xf",
                 "evaluator.preprocessing_function_names=[transform_features]",
                 f"evaluator.metrics_specs={METRICS_SPECS}", "serving.model_name=taxi", "mlflow.enabled=false"]
    return loopline_run_child(root, *overrides)


def test_the_example_files_are_tfx_s_bytes():
    readme = (TAXI / "README.md").read_text()
    listed = dict(re.findall(r"\| `([^`]+)` \| `[^`]+` \| `([0-9a-f]{64})` \|", readme))
    assert set(listed) == {"taxi_utils_native_keras.py", "data/data.csv"}
    for name, digest in listed.items():
        assert hashlib.sha256((TAXI / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.slow
def test_the_one_sigmoid_column_is_evaluated_as_a_binary_classifier(taxi_run):
    """The Evaluator's figures are a classifier's on the label the model's transform_features
    answers: accuracy at 0.5, log loss and AUC, as computed here from the pushed SavedModel's own
    answers on the raw eval examples; TFX's BinaryAccuracy threshold gated it, and it beat the
    train split's class priors."""
    from sklearn.metrics import log_loss, roc_auc_score

    config, summary = taxi_run
    assert summary.blessed is True
    pattern = f"{config.pipeline.root}/tfx/CsvExampleGen/examples/*/Split-eval/*"
    records = tf.constant([r.numpy() for r in tf.data.TFRecordDataset(tf.io.gfile.glob(pattern), compression_type="GZIP")])
    model = tf.saved_model.load(summary.pushed_path)
    p = model.signatures["serving_default"](examples=records)["outputs"].numpy().reshape(-1)
    y = model.signatures["transform_features"](examples=records)["tips_xf"].numpy().reshape(-1)
    blessing = Path(glob_one(f"{config.pipeline.root}/tfx/Evaluator/blessing/*"))
    figures = json.loads((blessing / "blessing.json").read_text())
    candidate = figures["candidate"]
    assert candidate["tips_xf_examples"] == len(y)
    assert candidate["tips_xf_accuracy"] == pytest.approx(np.mean((p > 0.5) == y), abs=1e-9)
    assert candidate["tips_xf_loss"] == pytest.approx(log_loss(y, np.clip(p, 1e-7, 1 - 1e-7)), rel=1e-3)
    assert candidate["tips_xf_accuracy"] > max(np.mean(y), 1 - np.mean(y))  # above the majority class
    overall = json.loads((blessing / "slices.json").read_text())["slices"][0]
    assert overall["candidate"]["tips_xf_auc"] == pytest.approx(roc_auc_score(y, p), abs=2e-3)
    assert any(r.startswith("slice Overall: tips_xf_accuracy") and "in [0.6, inf]" in r for r in figures["reasons"])


def glob_one(pattern: str) -> str:
    (path,) = tf.io.gfile.glob(pattern)
    return path
