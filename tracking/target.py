"""Where runs go: the tracking URI, experiment and HTTP limits, resolved once by the pipeline and
handed to components as JSON (components may run in other processes or pods)."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from mlflow.tracking import MlflowClient


@dataclass
class TrackingTarget:
    tracking_uri: str
    experiment: str = "loopline"
    # Only for the embedded store; a server chooses its own artifact store.
    artifact_location: str | None = None
    flush_interval_s: float = 2.0
    close_timeout_s: float = 30.0
    http_retries: int = 2
    http_timeout_s: float = 20.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TrackingTarget":
        return cls(**json.loads(text))


def embedded_store(root: str) -> tuple[str, str]:
    """(tracking URI, artifact location) of the embedded store in `<root>/mlflow`."""
    folder = Path(root).resolve() / "mlflow"
    return f"sqlite:///{folder / 'mlflow.db'}", (folder / "artifacts").as_uri()


def make_client(target: TrackingTarget) -> MlflowClient:
    # MLflow's HTTP defaults (7 retries, exponential backoff, 120 s timeout) block for minutes
    # when the server is gone; these variables are read per request.
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(target.http_retries)
    os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = "1"
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(int(max(1, target.http_timeout_s)))
    if target.tracking_uri.startswith("sqlite:///"):
        Path(target.tracking_uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=target.tracking_uri, registry_uri=target.tracking_uri)


def ensure_experiment(client: MlflowClient, target: TrackingTarget) -> str:
    """The experiment's id, creating it (with the embedded artifact location) when missing."""
    experiment = client.get_experiment_by_name(target.experiment)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(target.experiment, artifact_location=target.artifact_location)
    except Exception:
        # Another process may have created it in between.
        experiment = client.get_experiment_by_name(target.experiment)
        if experiment is None:
            raise
        return experiment.experiment_id
