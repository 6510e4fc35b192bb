"""The whole pipeline with `pipeline.root` and `data.path` on a filesystem that is not this
machine's disk: TensorFlow's in-memory `ram://` (Beam in process, through tests/ram_filesystem),
registered in a real `mlflow server`. Every output is read back from `ram://`, and nothing lands
on the local disk under a folder named `ram:`. `loopline train` on a `ram://` work dir too."""
from __future__ import annotations

import json
import os
import tempfile
import uuid

import pytest
import tensorflow as tf
from mlflow.tracking import MlflowClient

import tests.ram_filesystem  # noqa: F401  (registers the `ram` scheme with Beam)
from tests.conftest import REPO, make_config
from tests.mlflow_server import MlflowServer

pytestmark = pytest.mark.slow


def _ram_copy_of_data(base: str) -> str:
    path = f"{base}/data/penguins.csv"
    tf.io.gfile.makedirs(f"{base}/data")
    tf.io.gfile.copy(str(REPO / "data" / "penguins.csv"), path, overwrite=True)
    return path


def _local_ram_folders(*roots: str) -> list[str]:
    """Paths named `ram:*` under the roots: what a local-only call on a `ram://` path leaves."""
    found = []
    for root in roots:
        for folder, dirs, files in os.walk(root):
            found += [os.path.join(folder, n) for n in dirs + files if n.startswith("ram:")]
            dirs[:] = [d for d in dirs if not d.startswith(".")]
    return found


def _read(path: str, mode: str = "r"):
    with tf.io.gfile.GFile(path, mode) as f:
        return f.read()


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty current directory, checked to stay empty."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield cwd
    assert os.listdir(cwd) == [], f"files written into the current directory: {os.listdir(cwd)}"
    assert _local_ram_folders(str(tmp_path), tempfile.gettempdir()) == []


def test_pipeline_on_ram_root_end_to_end(tmp_path, workdir):
    from pipeline.local_runner import run_local

    base = f"ram://loopline-{uuid.uuid4().hex[:8]}"
    server = MlflowServer(tmp_path / "mlflow").start()
    try:
        config = make_config(
            tmp_path, f"pipeline.root={base}/root", f"data.path={_ram_copy_of_data(base)}",
            f"pipeline.metadata_path={tmp_path / 'metadata.sqlite'}", f"mlflow.tracking_uri={server.uri}",
            "trainer.epochs=2",
        )
        summary = run_local(config)
        assert summary.blessed is True and summary.version is not None
        pushed = summary.pushed_path
        assert pushed.startswith(f"{base}/root/serving/penguins/")
        # The pushed SavedModel loads and answers, from ram://.
        loaded = tf.saved_model.load(pushed)
        assert "serving_default" in loaded.signatures and "predict_raw" in loaded.signatures
        assert tf.io.gfile.exists(f"{pushed}/assets.extra/tf_serving_warmup_requests")
        assert json.loads(_read(f"{pushed}/assets.extra/loopline_signature.json"))["features"]

        model_dir = os.path.dirname(summary.saved_model)
        report = json.loads(_read(f"{model_dir}/export_report.json"))
        for variant in report["tflite"]:
            assert variant["passed"]
            assert len(_read(variant["path"], "rb")) == variant["size_bytes"]
            assert variant["path"].startswith(base)
        assert report["saved_model"]["size_bytes"] > 0
        assert tf.io.gfile.exists(f"{model_dir}/export_report.md")

        blessings = tf.io.gfile.glob(f"{base}/root/tfx/Evaluator/blessing/*")
        assert len(blessings) == 1
        assert tf.io.gfile.exists(f"{blessings[0]}/BLESSED")
        assert json.loads(_read(f"{blessings[0]}/blessing.json"))["blessed"] is True
        runs = tf.io.gfile.glob(f"{base}/root/tfx/Trainer/model_run/*")
        assert json.loads(_read(f"{runs[0]}/metrics.json"))["steps"] > 0

        serving = f"{base}/root/serving"
        for name in ("models.config", "batching.config", "monitoring.config"):
            assert tf.io.gfile.exists(f"{serving}/{name}"), name
        assert f'base_path: "{serving}/penguins"' in _read(f"{serving}/models.config")

        # Registered in the server, with the files that were only on ram://.
        client = MlflowClient(server.uri)
        [version] = client.search_model_versions("name = 'penguins'")
        assert version.tags["loopline.serving_version"] == summary.version
        run_id = version.run_id
        logged = {a.path for a in client.list_artifacts(run_id, "export")}
        assert {"export/export_report.json", "export/Format-TFLite"} <= logged
        assert {a.path for a in client.list_artifacts(run_id, "data")} == {"data/statistics", "data/schema"}
        assert any(a.path == "trainer/metrics.json" for a in client.list_artifacts(run_id, "trainer"))

        # `loopline data report` reads the run's statistics from ram:// and writes its page there.
        from pipeline.data_report import data_report

        page = data_report(config)
        assert page.startswith(f"{base}/root/reports/data/") and "species" in _read(page)
        assert tf.io.gfile.glob(f"{os.path.dirname(page)}/*.png")
    finally:
        server.stop()


def test_loopline_train_on_ram_work_dir(tmp_path, workdir, capsys):
    """The TFJob's command on a remote work dir: data.path read through gfile, the chief's export in
    the Model artifact's layout, metrics.json, and the run (metrics, parameters, files) in MLflow."""
    from pipeline.cli import main

    base = f"ram://loopline-{uuid.uuid4().hex[:8]}"
    work_dir = f"{base}/train"
    server = MlflowServer(tmp_path / "mlflow").start()
    try:
        code = main(["train", "--config", str(REPO / "loopline.yaml"), "--work-dir", work_dir,
                     "--set", f"pipeline.root={base}/root", "--set", f"data.path={_ram_copy_of_data(base)}",
                     "--set", f"mlflow.tracking_uri={server.uri}", "--set", "trainer.epochs=2",
                     "--set", "export.tflite_variants=[float32]"])
        assert code == 0
        assert f"model in {work_dir}/model" in capsys.readouterr().out
        model = f"{work_dir}/model"
        loaded = tf.saved_model.load(f"{model}/Format-Serving")
        assert {"serving_default", "predict_raw"} <= set(loaded.signatures)
        assert tf.io.gfile.exists(f"{model}/Format-Serving/assets.extra/tf_serving_warmup_requests")
        assert tf.io.gfile.exists(f"{model}/Format-TFLite/model_float32.tflite")
        assert json.loads(_read(f"{model}/export_report.json"))["tflite"][0]["passed"]
        metrics = json.loads(_read(f"{work_dir}/metrics.json"))
        assert metrics["steps"] > 0
        assert tf.io.gfile.glob(f"{work_dir}/checkpoints/ckpt-*.index")
        assert tf.io.gfile.exists(f"{work_dir}/data/train/data.tfrecord.gz")

        client = MlflowClient(server.uri)
        [run] = client.search_runs([client.get_experiment_by_name("loopline").experiment_id])
        assert run.info.status == "FINISHED"
        assert run.data.params["trainer.epochs"] == "2"
        assert run.data.tags["loopline.model_uri"] == model
        history = client.get_metric_history(run.info.run_id, "train/loss")  # logged once per steps_per_loop
        assert history and max(m.step for m in history) == metrics["steps"]
        logged = {a.path for a in client.list_artifacts(run.info.run_id, "model")}
        assert {"model/Format-Serving", "model/Format-TFLite", "model/export_report.json"} <= logged
    finally:
        server.stop()
