"""The compiled Kubeflow spec runs: tests/kfp_harness executes `loopline compile`'s PipelineJob task
by task as the KFP launcher does (ExampleGen's driver included), each task in a fresh process with
an empty working directory and HOME, the pipeline root on a folder every "pod" shares. It ends
where `loopline run` ends: a blessed, pushed SavedModel, a registered MLflow version, TF Serving's
config files. Run twice: each run is its own MLflow run."""
from __future__ import annotations

import json
import shutil
import time

import pytest
import tensorflow as tf
from mlflow.tracking import MlflowClient

from tests.conftest import REPO, make_config
from tests.kfp_harness import SpecRunner
from tests.mlflow_server import MlflowServer

pytestmark = pytest.mark.slow


def test_compiled_spec_runs_task_by_task_twice(tmp_path, capsys):
    from pipeline.kubeflow_runner import IMAGE_PREFIX, compile_kubeflow

    shared = tmp_path / "volume"  # mounted at this path in every pod
    (shared / "data").mkdir(parents=True)
    shutil.copy(REPO / "data" / "penguins.csv", shared / "data" / "penguins.csv")
    server = MlflowServer(tmp_path / "mlflow").start()
    try:
        config = make_config(tmp_path, f"pipeline.root={shared / 'root'}", f"data.path={shared / 'data' / 'penguins.csv'}",
                             f"mlflow.tracking_uri={server.uri}", "trainer.epochs=2",
                             "export.tflite_variants=[float32]", "export.latency_runs=5")
        compile_kubeflow(config, "registry.example.com/loopline:test", tmp_path / "pipeline.json", allow_local_paths=True)
        runner = SpecRunner(tmp_path / "pipeline.json", REPO, IMAGE_PREFIX, tmp_path / "pods")
        (tmp_path / "pods").mkdir()
        started = time.monotonic()
        runs = [runner.run(), runner.run()]
        with capsys.disabled():
            print(f"\nKFP spec executed twice in {time.monotonic() - started:.0f} s ({len(runs[0].order)} tasks each)")

        assert runs[0].order[0] == "CsvExampleGen" and runs[0].order.index("Pusher") < runs[0].order.index("Registrar")
        client = MlflowClient(server.uri)
        versions = sorted(client.search_model_versions("name = 'penguins'"), key=lambda v: int(v.version))
        assert [v.version for v in versions] == ["1", "2"]
        assert len({v.run_id for v in versions}) == 2, "each pipeline run gets its own MLflow run"
        for run, version in zip(runs, versions):
            assert version.tags["loopline.pipeline_run_id"] == run.run_id
            assert client.get_run(version.run_id).data.tags["loopline.pipeline_run_id"] == run.run_id
            blessing = run.outputs["Evaluator"]["blessing"]
            assert blessing["metadata"]["blessed"] == 1
            assert tf.io.gfile.exists(f"{blessing['uri']}/BLESSED")
            pushed = run.outputs["Pusher"]["pushed_model"]["metadata"]
            assert pushed["pushed"] == 1
            assert version.tags["loopline.serving_version"] == pushed["pushed_version"]
            assert tf.io.gfile.exists(f"{pushed['pushed_destination']}/saved_model.pb")
            assert tf.io.gfile.exists(f"{pushed['pushed_destination']}/assets.extra/tf_serving_warmup_requests")
        serving = shared / "root" / "serving"
        assert {p.name for p in serving.iterdir()} >= {"models.config", "batching.config", "monitoring.config", "penguins"}
        assert f'base_path: "{serving}/penguins"' in (serving / "models.config").read_text()
        assert len([p for p in (serving / "penguins").iterdir() if p.name.isdigit()]) == 2
        report = json.loads((shared / "root" / "tfx").joinpath(
            runs[1].run_id, *[p.name for p in (shared / "root" / "tfx" / runs[1].run_id).glob("Trainer_*")],
            "model", "export_report.json").read_text())
        assert all(v["passed"] for v in report["tflite"])
    finally:
        server.stop()
