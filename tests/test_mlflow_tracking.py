"""MLflow end to end against a real `mlflow server`: two real pipeline runs, then the run, its
params, metric history and artifacts, the logged pyfunc model, the registered versions and their
tags, promotion and rollback rewriting TF Serving's models.config, and `loopline models`."""
from __future__ import annotations

import json
import os

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import make_config
from tests.mlflow_server import MlflowServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def two_runs(server, tmp_path_factory):
    """Two pipeline runs (different seeds, so two models) into the server; in the second, the
    dynamic-range TFLite variant cannot meet a zero tolerance, so it is dropped."""
    from pipeline.local_runner import open_store, run_local

    root = tmp_path_factory.mktemp("workspace-mlflow")
    summaries, run_ids = [], []
    for seed in (1, 2):
        strict = ["export.output_tolerance={dynamic_range: 0.0}"] if seed == 2 else []
        # A constant rate: under the bundled cosine decay two 3-epoch seeds differ by more than the
        # champion comparison allows (5%), so the second would rightly not be pushed; two pushes are needed here.
        config = make_config(root, f"mlflow.tracking_uri={server.uri}", "trainer.epochs=3", f"trainer.seed={seed}",
                             "mlflow.flush_interval_s=0.5", "trainer.steps_per_loop=1", "trainer.lr_schedule=constant",
                             *strict)
        summaries.append(run_local(config))
        newest = max(open_store(config).get_contexts_by_type("pipeline_run"), key=lambda c: c.id)
        run_ids.append(newest.name)
    return config, summaries, run_ids


def _run_for(client, pipeline_run_id):
    experiment = client.get_experiment_by_name("loopline")
    runs = client.search_runs([experiment.experiment_id], f"tags.`loopline.pipeline_run_id` = '{pipeline_run_id}'")
    assert len(runs) == 1, f"one MLflow run per pipeline run, found {len(runs)}"
    return runs[0]


def test_each_pipeline_run_is_an_mlflow_run_with_config_metrics_and_artifacts(server, two_runs):
    config, summaries, pipeline_runs = two_runs
    client = MlflowClient(server.uri)
    run = _run_for(client, pipeline_runs[0])

    # The whole resolved config as parameters.
    flat = config.flat()
    assert run.data.params["trainer.epochs"] == "3"
    assert run.data.params["trainer.seed"] == "1"
    assert run.data.params["mlflow.tracking_uri"] == server.uri
    assert set(flat) <= set(run.data.params)

    # Per-step training metrics (one step per loop call here) and per-epoch evaluation, delivered in batches.
    history = client.get_metric_history(run.info.run_id, "train/loss")
    steps = sorted(m.step for m in history)
    assert steps == list(range(1, int(summaries[0].metrics["steps"]) + 1))
    assert len(client.get_metric_history(run.info.run_id, "eval/loss")) == 3  # trainer.epochs
    assert run.data.metrics["final_eval/species_accuracy"] == pytest.approx(summaries[0].metrics["species_accuracy"])
    # Which weights were exported, and the trivial floor the blessing held them to (docs/model-quality.md).
    exported = summaries[0].exported
    assert run.data.tags["loopline.exported_weights"].startswith(f"epoch {exported['epoch']}, step {exported['step']}")
    assert run.data.metrics["exported/step"] == exported["step"]
    assert set(json.loads(run.data.tags["loopline.blessing_reasons"])) == set(summaries[0].blessing_reasons)
    assert run.data.metrics["trivial_floor/species_loss"] > 2 * run.data.metrics["final_eval/species_loss"]

    # System info and the trainer's files.
    assert run.data.tags["system.version.tensorflow"]
    assert "CPU" in run.data.tags["system.devices"]
    artifacts = {f.path for f in client.list_artifacts(run.info.run_id, "trainer")}
    assert "trainer/metrics.json" in artifacts
    metrics_file = client.download_artifacts(run.info.run_id, "trainer/metrics.json")
    assert json.load(open(metrics_file))["steps"] == summaries[0].metrics["steps"]
    assert run.info.status == "FINISHED"


def test_a_variant_that_misses_parity_is_dropped_not_the_run(server, two_runs):
    """Only export.required_variants (float32) fail a run; a dropped variant is said in the
    summary, the export report and the MLflow run, and its file is gone."""
    _, summaries, pipeline_runs = two_runs
    assert summaries[0].tflite_dropped == {}
    dropped = summaries[1].tflite_dropped
    assert list(dropped) == ["dynamic_range"] and "> tolerance 0" in dropped["dynamic_range"]
    assert summaries[1].version is not None  # trained, blessed and pushed all the same
    assert any(line.startswith("tflite     dropped dynamic_range: output") for line in summaries[1].lines())
    model_dir = os.path.dirname(summaries[1].saved_model)
    report = json.load(open(os.path.join(model_dir, "export_report.json")))
    by_variant = {v["variant"]: v for v in report["tflite"]}
    assert by_variant["dynamic_range"]["dropped"] and not by_variant["float32"]["dropped"]
    assert sorted(os.listdir(os.path.join(model_dir, "Format-TFLite"))) == ["model_float32.tflite"]
    run = _run_for(MlflowClient(server.uri), pipeline_runs[1])
    assert json.loads(run.data.tags["loopline.tflite_dropped"]) == dropped


def test_model_is_registered_with_lineage_and_loads_as_pyfunc(server, two_runs):
    import mlflow.pyfunc

    from tracking.system_info import current_commit

    _, summaries, pipeline_runs = two_runs
    client = MlflowClient(server.uri)
    version = client.get_model_version("penguins", "1")
    assert version.tags["loopline.pipeline_run_id"] == pipeline_runs[0]
    assert version.tags["loopline.mlmd_execution_id"].isdigit()
    assert version.tags["loopline.serving_version"] == summaries[0].version
    assert version.tags.get("loopline.git_commit") == current_commit()
    assert version.run_id == _run_for(client, pipeline_runs[0]).info.run_id
    assert client.get_model_version("penguins", "2").tags["loopline.serving_version"] == summaries[1].version

    os.environ["MLFLOW_TRACKING_URI"] = server.uri
    try:
        model = mlflow.pyfunc.load_model("models:/penguins/1")
    finally:
        del os.environ["MLFLOW_TRACKING_URI"]
    assert model.metadata.signature is not None
    assert "bill_length_mm" in model.metadata.signature.inputs.input_names()
    rows = pd.DataFrame([
        dict(island="Biscoe", bill_length_mm=47.5, bill_depth_mm=14.2, flipper_length_mm=210.0, body_mass_g=4600.0, sex="female", year=2008.0),
        dict(island="Torgersen", bill_length_mm=39.1, bill_depth_mm=18.7, flipper_length_mm=181.0, body_mass_g=3750.0, sex="male", year=2007.0),
    ])
    out = model.predict(rows)
    assert list(out["species"]) == ["Gentoo", "Adelie"]
    assert out[[c for c in out.columns if c.startswith("species_score_")]].sum(axis=1).round(4).tolist() == [1.0, 1.0]


def _write_models_config(config):
    from tensorflow_serving.config import model_server_config_pb2

    from serving.model_config import model_config_path, write_model_server_config

    serving_root = os.path.join(config.pipeline.root, "serving")
    server_config = model_server_config_pb2.ModelServerConfig()
    model = server_config.model_config_list.config.add()
    model.name, model.base_path, model.model_platform = "penguins", os.path.join(serving_root, "penguins"), "tensorflow"
    path = model_config_path(serving_root)
    write_model_server_config(path, server_config)
    return path


def test_promote_and_rollback_move_alias_and_serving_labels(server, two_runs, capsys):
    from pipeline.cli import main
    from serving.model_config import read_model_server_config

    config, summaries, _ = two_runs
    path = _write_models_config(config)
    client = MlflowClient(server.uri)
    args = ["--config", "loopline.yaml", "--set", f"pipeline.root={config.pipeline.root}",
            "--set", f"mlflow.tracking_uri={server.uri}"]

    def labels():
        return dict(read_model_server_config(path).model_config_list.config[0].version_labels)

    assert main(["promote", *args, "--model", "penguins", "--version", "1", "--alias", "champion"]) == 0
    assert client.get_model_version_by_alias("penguins", "champion").version == "1"
    assert labels() == {"stable": int(summaries[0].version)}

    assert main(["promote", *args, "--version", "2", "--alias", "champion"]) == 0
    assert main(["promote", *args, "--version", "1", "--alias", "challenger"]) == 0
    assert client.get_model_version_by_alias("penguins", "champion").version == "2"
    assert labels() == {"stable": int(summaries[1].version), "canary": int(summaries[0].version)}

    assert main(["promote", *args, "--rollback", "--alias", "champion"]) == 0
    assert client.get_model_version_by_alias("penguins", "champion").version == "1"
    assert labels()["stable"] == int(summaries[0].version)
    history = json.loads(client.get_registered_model("penguins").tags["loopline.alias_history.champion"])
    assert [(e["action"], e["version"]) for e in history] == [("promote", "1"), ("promote", "2"), ("rollback", "1")]

    # Nothing before version 1: a clear refusal, the alias stays.
    assert main(["promote", *args, "--rollback", "--alias", "champion"]) == 2
    assert "no previous holder" in capsys.readouterr().err
    assert main(["promote", *args, "--version", "9", "--alias", "champion"]) == 2
    assert "has no version 9; versions are [1, 2]" in capsys.readouterr().err
    assert client.get_model_version_by_alias("penguins", "champion").version == "1"

    assert main(["models", *args]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "penguins (2 versions)"
    by_version = {line.split()[0]: line.split() for line in table[2:]}
    assert by_version["1"][1] == "challenger,champion" and by_version["2"][1] == "-"
    assert by_version["1"][2] == summaries[0].version
