"""The default: no tracking server configured, runs go to an embedded store in the workspace."""
import os

import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow


def test_default_run_is_tracked_in_the_workspace(pipeline_run):
    config, summary = pipeline_run
    folder = os.path.join(config.pipeline.root, "mlflow")
    client = MlflowClient(f"sqlite:///{folder}/mlflow.db")
    experiment = client.get_experiment_by_name(config.mlflow.experiment)
    assert experiment.artifact_location.startswith(f"file://{folder}/artifacts")
    version = client.get_model_version(config.serving.model_name, "1")
    assert version.tags["loopline.serving_version"] == summary.version
    history = client.get_metric_history(version.run_id, "eval/species_accuracy")
    assert len(history) == config.trainer.epochs
    assert history[-1].value == pytest.approx(summary.metrics["species_accuracy"])
    assert os.path.isdir(os.path.join(folder, "artifacts"))
    run = client.get_run(version.run_id)
    assert run.data.params["pipeline.root"] == config.pipeline.root
