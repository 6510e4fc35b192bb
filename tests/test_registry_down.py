"""A tracking server that is down when the model is to be registered: one line naming the server,
what was already saved, and how to register it; no traceback from the CLI."""
from __future__ import annotations

import pytest

from tests.mlflow_server import free_port


def _registration(tmp_path, uri: str):
    from tracking.registration import Registration
    from tracking.target import TrackingTarget

    return Registration(
        target=TrackingTarget(tracking_uri=uri, http_retries=0, http_timeout_s=2),
        registered_model="penguins", pipeline_name="penguins", pipeline_run_id="run-1", execution_id="9",
        model_dir=str(tmp_path / "model"), saved_model_dir=str(tmp_path / "model" / "Format-Serving"),
        serving_version="1767225600", pushed_path="gs://bucket/root/serving/penguins/1767225600",
    )


def test_unreachable_server_is_one_line_naming_what_was_saved(tmp_path):
    from tracking.registration import RegistryUnavailableError, register_pipeline_run

    uri = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RegistryUnavailableError) as raised:
        register_pipeline_run(_registration(tmp_path, uri))
    message = str(raised.value)
    assert "\n" not in message
    assert f"MLflow tracking server {uri} did not answer" in message
    assert "pushed as serving version 1767225600 (gs://bucket/root/serving/penguins/1767225600)" in message
    assert "run the pipeline again with the same configuration" in message
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_other_registry_errors_are_not_disguised(tmp_path, monkeypatch):
    """A server that answers but refuses is not "down": its error passes through unchanged."""
    from tracking import registration

    def refuse(_reg):
        raise ValueError("RESOURCE_DOES_NOT_EXIST: experiment")

    monkeypatch.setattr(registration, "_register", refuse)
    with pytest.raises(ValueError, match="RESOURCE_DOES_NOT_EXIST"):
        registration.register_pipeline_run(_registration(tmp_path, "http://127.0.0.1:1"))


def test_cli_prints_one_line_and_exits_1(tmp_path, monkeypatch, capsys):
    from pipeline import cli, local_runner
    from tracking.registration import RegistryUnavailableError

    message = "MLflow tracking server http://mlflow:5000 did not answer (...); the model was pushed ..."

    def run_local(_config, run_id):
        raise RegistryUnavailableError(message)

    monkeypatch.setattr(local_runner, "run_local", run_local)
    code = cli.main(["run", "--set", f"pipeline.root={tmp_path}"])
    assert code == 1
    [log] = (tmp_path / "logs").glob("*.log")
    assert capsys.readouterr().err.strip() == f"loopline: {message} (log: {log})"
    assert f"loopline: {message}\nTraceback" in log.read_text()  # the log ends with the line and where it came from
