"""The tracking server goes away: training still finishes and the model is saved and pushed;
metrics are buffered, saved when they cannot be sent, and replayed later. Nothing is lost."""
from __future__ import annotations

import os
import threading
import time

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import make_config
from tests.mlflow_server import MlflowServer, free_port
from tracking.metric_sink import UNDELIVERED_FILE, read_metrics

pytestmark = pytest.mark.slow

EPOCHS = 40  # 240 steps, a metric value each: the server is killed within the first epochs


def _kill_when_metrics_arrive(server: MlflowServer, stop: threading.Event, killed: threading.Event) -> None:
    client = MlflowClient(server.uri)
    deadline = time.monotonic() + 300
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            experiment = client.get_experiment_by_name("loopline")
            runs = client.search_runs([experiment.experiment_id]) if experiment else []
            if runs and runs[0].data.metrics.get("train/loss") is not None:
                server.kill()
                killed.set()
                return
        except Exception:
            pass
        time.sleep(0.2)


def test_server_killed_mid_training_then_back(tmp_path):
    from pipeline.local_runner import open_store, run_local

    server = MlflowServer(tmp_path / "server").start()
    stop, killed = threading.Event(), threading.Event()
    watcher = threading.Thread(target=_kill_when_metrics_arrive, args=(server, stop, killed), daemon=True)
    root = tmp_path / "workspace"
    overrides = [f"mlflow.tracking_uri={server.uri}", f"trainer.epochs={EPOCHS}", "mlflow.flush_interval_s=0",
                 "mlflow.close_timeout_s=10", "mlflow.http_retries=1",
                 "trainer.steps_per_loop=1"]  # a metric value per step, so the outage falls mid-training
    try:
        watcher.start()
        config = make_config(root, *overrides)
        # The Registrar cannot reach the server: the run fails there, after training and the push,
        # with one line naming the server, the pushed version and how to register it.
        from tracking.registration import RegistryUnavailableError

        with pytest.raises(RegistryUnavailableError) as raised:
            run_local(config)
        message = str(raised.value)
        assert "\n" not in message and f"MLflow tracking server {server.uri} did not answer" in message
        assert "pushed as serving version" in message and "run the pipeline again" in message
        stop.set()
        watcher.join(30)
        assert killed.is_set(), "the server was not stopped during the run"

        store = open_store(config)
        models = store.get_artifacts_by_type("Model")
        assert len(models) == 1
        model = models[0]
        assert os.path.isfile(os.path.join(model.uri, "Format-Serving", "saved_model.pb"))
        assert len(store.get_artifacts_by_type("PushedModel")) == 1
        run_id = model.custom_properties["mlflow_run_id"].string_value
        assert run_id, "the run was opened before the outage"
        undelivered = model.custom_properties["mlflow_undelivered_metrics"].int_value
        assert undelivered > 0
        model_run = store.get_artifacts_by_type("ModelRun")[0]
        spilled = read_metrics(os.path.join(model_run.uri, UNDELIVERED_FILE))
        assert len(spilled) == undelivered
        assert {m.key for m in spilled} >= {"train/loss", "eval/loss"}

        # The server comes back (same store, same port); the re-run registers and replays.
        server = MlflowServer(tmp_path / "server", port=server.port).start()
        summary = run_local(config)
        assert summary.executions["Trainer"] == "CACHED"
        assert summary.executions["Registrar"] == "COMPLETE"
        client = MlflowClient(server.uri)
        history = client.get_metric_history(run_id, "train/loss")
        assert sorted(m.step for m in history) == sorted({m.step for m in history})  # no duplicates
        steps = int(model.custom_properties["eval_steps"].double_value)
        assert sorted(m.step for m in history) == list(range(1, steps + 1))  # every step, once
        assert len(client.get_metric_history(run_id, "eval/loss")) == EPOCHS
        assert client.get_model_version("penguins", "1").run_id == run_id
    finally:
        stop.set()
        server.stop()


def test_sink_buffers_while_server_is_down_and_sends_when_it_comes_up(tmp_path):
    """Down at the start: the run is opened and everything delivered once the server answers."""
    from tracking.target import TrackingTarget
    from tracking.training_run import TrainingRun

    port = free_port()
    target = TrackingTarget(tracking_uri=f"http://127.0.0.1:{port}", flush_interval_s=0.2, close_timeout_s=60,
                            http_retries=0, http_timeout_s=5)
    run = TrainingRun(target, {"loopline.pipeline": "outage"}, spill_dir=str(tmp_path))
    for step in range(1, 6):
        run.sink.log(step, {"train/loss": 1.0 / step})  # must neither raise nor block
    server = MlflowServer(tmp_path / "server", port=port).start()
    try:
        for step in range(6, 11):
            run.sink.log(step, {"train/loss": 1.0 / step})
        report = run.finish({})
        assert report.undelivered == 0 and report.delivered == 10, report.line()
        history = MlflowClient(server.uri).get_metric_history(report.run_id, "train/loss")
        assert [m.step for m in history] == list(range(1, 11))
        assert not os.path.exists(tmp_path / UNDELIVERED_FILE)
    finally:
        server.stop()


def test_sink_reports_and_saves_what_it_could_not_send(tmp_path, caplog):
    from tracking.target import TrackingTarget
    from tracking.training_run import TrainingRun

    target = TrackingTarget(tracking_uri=f"http://127.0.0.1:{free_port()}", flush_interval_s=0.1, close_timeout_s=3,
                            http_retries=0, http_timeout_s=2)
    run = TrainingRun(target, {}, spill_dir=str(tmp_path))
    for step in range(1, 4):
        run.sink.log(step, {"train/loss": float(step), "eval/loss": float(step)})
    with caplog.at_level("WARNING", logger="loopline.tracking"):
        report = run.finish({})
    assert report.run_id is None and report.delivered == 0 and report.undelivered == 6
    saved = read_metrics(str(tmp_path / UNDELIVERED_FILE))
    assert sorted((m.key, m.step) for m in saved) == sorted((k, s) for s in (1, 2, 3) for k in ("train/loss", "eval/loss"))
    assert "6 of 6 metric values were not delivered" in caplog.text
