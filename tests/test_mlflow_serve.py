"""The registered MLflow model serves: `mlflow models serve -m models:/<name>/<version>
--env-manager local` (a real process on loopback, stopped with its whole process group: its
uvicorn children outlive a plain kill) answers a DataFrame request with the embedded server's
predictions for the same rows."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import requests
from mlflow.tracking import MlflowClient

from serving.config import ServingConfig
from serving.config_writer import write_serving_configs
from serving.server import ModelServer
from tests.conftest import subprocess_env
from tests.mlflow_server import free_port
from tests.serving_helpers import add_version, export_model
from tracking.logged_model import log_saved_model, register

pytestmark = pytest.mark.slow

ROWS = pd.DataFrame({"bill_length_mm": [40.0, 50.5, np.nan], "flipper_length_mm": [190.0, 222.0, 181.0],
                     "island": ["Dream", "Biscoe", "Torgersen"]})


def _registered(tmp_path) -> tuple[str, str]:
    """Logs and registers a small export in an embedded store; returns (tracking URI, model dir)."""
    saved_model = str(export_model(tmp_path / "export"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("serve", artifact_location=(tmp_path / "artifacts").as_uri())
    run = client.create_run(experiment)
    model_uri = log_saved_model(uri, run.info.run_id, saved_model, ROWS.head(2))
    client.set_terminated(run.info.run_id)
    version = register(client, uri, model_uri, "penguins-serve", run.info.run_id, {})
    assert str(version.version) == "1"
    return uri, saved_model


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(20)


def test_mlflow_models_serve_answers_as_the_embedded_server(tmp_path):
    uri, saved_model = _registered(tmp_path)
    port = free_port()
    env = subprocess_env(MLFLOW_TRACKING_URI=uri, PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))
    log = open(tmp_path / "serve.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "mlflow", "models", "serve", "-m", "models:/penguins-serve/1",
                                "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)],
                               cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    root = tmp_path / "serving"
    add_version(root / "penguins", Path(saved_model), 1)
    write_serving_configs(str(root), ServingConfig())
    embedded = ModelServer(str(root), ServingConfig(grpc_port=0, rest_port=0)).start()
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            try:
                if requests.get(f"http://127.0.0.1:{port}/ping", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, "mlflow models serve did not answer /ping"
            time.sleep(0.5)
        body = {"dataframe_split": ROWS.replace({np.nan: None}).to_dict(orient="split", index=False)}
        answer = requests.post(f"http://127.0.0.1:{port}/invocations", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        served = pd.DataFrame(answer.json()["predictions"])

        instances = [{"bill_length_mm": [float(r.bill_length_mm)], "flipper_length_mm": [r.flipper_length_mm],
                      "island": [r.island]} for r in ROWS.itertuples()]
        ours = requests.post(f"http://127.0.0.1:{embedded.rest_port}/v1/models/penguins:predict", timeout=60,
                             data=json.dumps({"signature_name": "predict_raw", "instances": instances})).json()
    finally:
        embedded.stop(grace=0)
        _stop(process)
    scores = np.array([p["scores"] for p in ours["predictions"]])
    classes = ours["predictions"][0]["classes"]
    assert list(served["species"]) == [classes[i] for i in scores.argmax(axis=1)]
    np.testing.assert_allclose(served[[f"species_score_{c}" for c in classes]].to_numpy(), scores, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(served["body_mass_g"], [p["body_mass_g"][0] for p in ours["predictions"]], rtol=1e-5)
