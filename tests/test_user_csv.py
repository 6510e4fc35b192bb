"""A user's own CSV with the default configuration: column names with spaces, parentheses, dots,
dashes and non-ASCII letters, integer class labels declared by data.label_kind, and a class in the
eval file that training never saw. The default penguins module gives way to the generic model."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from tests.conftest import make_config


def write_iris_like(path, rows: int, seed: int, classes=(0, 1, 2)) -> None:
    rng = np.random.default_rng(seed)
    lines = ["sepal length (cm),petal.width-cm,größe,species"]
    for i in range(rows):
        label = classes[i % len(classes)]
        lines.append(f"{4 + label + rng.normal(0, 0.3):.2f},{0.2 + label + rng.normal(0, 0.2):.2f},"
                     f"{['klein', 'mittel', 'groß'][label % 3]},{label}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.slow
def test_iris_like_csv_with_the_default_configuration(tmp_path, caplog):
    from pipeline.local_runner import run_local

    write_iris_like(tmp_path / "train.csv", 150, seed=0)
    write_iris_like(tmp_path / "eval.csv", 30, seed=1, classes=(0, 1, 2, 9))  # 9: never seen in training
    config = make_config(tmp_path / "root", f"data.path={tmp_path / 'train.csv'}",
                         f"data.eval_path={tmp_path / 'eval.csv'}", "data.label_kind=classification",
                         "trainer.epochs=10", "mlflow.enabled=false", "serving.model_name=iris",
                         "validation.warn_only=true")
    assert config.trainer.module_file.endswith("penguins/model.py")  # the default module, for other data
    with caplog.at_level(logging.WARNING):
        summary = run_local(config)
    assert sum("is for other data" in r.getMessage() for r in caplog.records) == 1
    # Validation reports the eval split's unseen class as skew of the label (warn_only lets training go on).
    assert "'species' distribution differs from 'train'" in caplog.text
    # ... and the class itself, for an integer label declared classification, as a warning in the summary.
    assert summary.data_warnings == ["[eval] species: classification label 'species' has 1 class(es) in split 'eval' "
                                     "that the 'train' split never has: '9', in 7 of 30 labelled examples (23.3%); the "
                                     "model cannot predict them (counted as species_unseen_label_examples). "
                                     "(ENUM_TYPE_UNEXPECTED_STRING_VALUES)"]
    assert any(line.startswith("data       warning [eval] species:") for line in summary.lines())
    assert summary.metrics["species_unseen_label_examples"] == pytest.approx(7)  # rows 3, 7, ... of 30
    assert summary.metrics["species_accuracy"] > 0.9

    export = summary.saved_model
    with open(f"{export}/assets.extra/loopline_signature.json", encoding="utf-8") as f:
        description = json.load(f)
    assert description["signature_names"] == {"sepal length (cm)": "sepal_length_cm", "petal.width-cm": "petal_width_cm",
                                              "größe": "groe", "species": "species"}
    assert description["heads"][0]["vocabulary"] == ["0", "1", "2"]
    import tensorflow as tf

    raw = tf.saved_model.load(export).signatures["predict_raw"]
    assert sorted(raw.structured_input_signature[1]) == ["groe", "petal_width_cm", "sepal_length_cm"]

    # Served: `loopline predict` takes the CSV's own header; the server takes the signature names.
    import subprocess
    import sys

    from tests.conftest import REPO, subprocess_env
    from tests.serving_helpers import ServerProcess

    rows = tmp_path / "rows.csv"
    rows.write_text("sepal length (cm),petal.width-cm,größe\n4.0,0.2,klein\n6.0,2.2,groß\n", encoding="utf-8")
    server = ServerProcess(tmp_path / "root", "serving.model_name=iris")
    try:
        done = subprocess.run([sys.executable, "-m", "pipeline.cli", "predict", str(rows), "--model", "iris",
                               "--port", str(server.grpc_port), "--config", str(REPO / "loopline.yaml"), "--wait", "60"],
                              capture_output=True, text=True, timeout=120, env=subprocess_env(), cwd=REPO)
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    assert [line.split("=")[1].split()[0] for line in done.stdout.strip().splitlines()] == ["0", "2"]
