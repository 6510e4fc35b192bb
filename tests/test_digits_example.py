"""examples/digits end to end on a small subset: sklearn's digits written as an image folder of
PNGs, the pipeline with the example's own configuration (CNN module, mixed precision, TFLite
float32/dynamic_range/int8 behind the parity gate), served, and `loopline predict` on PNG files."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import REPO, subprocess_env
from tests.serving_helpers import ServerProcess

CONFIG = REPO / "examples" / "digits" / "loopline.yaml"


@pytest.mark.slow
def test_digits_image_folder_end_to_end(tmp_path):
    from examples.digits.make_data import write_digits
    from pipeline.config import load_config
    from pipeline.local_runner import run_local

    images = tmp_path / "digits"
    assert write_digits(str(images), per_class=40) == 400
    root = tmp_path / "root"
    config = load_config(CONFIG, [f"data.path={images}", f"pipeline.root={root}", "trainer.epochs=12",
                                  "mlflow.enabled=false", "evaluator.thresholds={label_accuracy: {min: 0.8}}"])
    assert config.trainer.precision == "mixed_bfloat16" and config.data.format == "image_folder"
    summary = run_local(config)
    assert summary.blessed and summary.pushed_path, summary.blessing_reasons
    assert summary.metrics["label_accuracy"] >= 0.8

    model_dir = summary.saved_model
    report = json.loads((root / "tfx" / "Trainer" / "model").glob("*/export_report.json").__next__().read_text())
    assert [(v["variant"], v["passed"]) for v in report["tflite"]] == [("float32", True), ("dynamic_range", True),
                                                                       ("int8", True)]
    signatures = report["signatures"]
    assert signatures["serving_default"]["inputs"] == {"inputs": {"dtype": "string", "shape": [None]}}
    assert signatures["predict_raw"]["inputs"] == {"image": {"dtype": "float32", "shape": [None, 8, 8, 1]}}

    # The same answer from the tf.Example signature (PNG decoded in the graph) and the decoded image.
    png = sorted((images / "3").iterdir())[0].read_bytes()
    example = tf.train.Example()
    example.features.feature["image"].bytes_list.value.append(png)
    loaded = tf.saved_model.load(model_dir)
    served = loaded.signatures["serving_default"](inputs=tf.constant([example.SerializeToString()]))
    pixels = tf.cast(tf.io.decode_png(png, channels=1), tf.float32)[tf.newaxis] / 255.0
    raw = loaded.signatures["predict_raw"](image=pixels)
    np.testing.assert_allclose(served["scores"].numpy(), raw["scores"].numpy(), rtol=1e-5, atol=1e-6)

    files = [str(sorted((images / str(d)).iterdir())[0]) for d in (0, 3, 7)]
    server = ServerProcess(root, "serving.model_name=digits")
    try:
        done = subprocess.run([sys.executable, "-m", "pipeline.cli", "predict", *files, "--config", str(CONFIG),
                               "--set", f"pipeline.root={root}", "--port", str(server.grpc_port), "--wait", "60"],
                              capture_output=True, text=True, timeout=120, env=subprocess_env(), cwd=REPO)
        assert done.returncode == 0, done.stderr + server.log()
        lines = done.stdout.strip().splitlines()
        assert [line.split(": ")[0] for line in lines] == files
        assert sum(f"label={d} " in line for d, line in zip((0, 3, 7), lines)) >= 2, lines
        rest = subprocess.run([sys.executable, "-m", "pipeline.cli", "predict", *files, "--config", str(CONFIG),
                               "--set", f"pipeline.root={root}", "--rest", "--port", str(server.rest_port)],
                              capture_output=True, text=True, timeout=120, env=subprocess_env(), cwd=REPO)
        assert rest.returncode == 0 and rest.stdout == done.stdout, rest.stderr
        # Rows with the decoded image as nested lists go to predict_raw.
        rows = tmp_path / "rows.json"
        decoded = [(tf.io.decode_png(open(f, "rb").read(), channels=1).numpy() / 255.0).tolist() for f in files]
        rows.write_text(json.dumps([{"image": image} for image in decoded]))
        raw_rows = subprocess.run([sys.executable, "-m", "pipeline.cli", "predict", str(rows), "--config", str(CONFIG),
                                   "--set", f"pipeline.root={root}", "--port", str(server.grpc_port)],
                                  capture_output=True, text=True, timeout=120, env=subprocess_env(), cwd=REPO)
        assert raw_rows.returncode == 0, raw_rows.stderr
        answers = lambda text: [line.split("=", 1)[1].split()[0] for line in text.strip().splitlines()]
        assert answers(raw_rows.stdout) == answers(done.stdout)  # "class=3 (0.97)" and "label=3 (0.97)"
    finally:
        server.stop()
