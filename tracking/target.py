"""Where runs go: the tracking URI, experiment and HTTP limits, resolved once by the pipeline and
handed to components as JSON (components may run in other processes or pods)."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import portalocker
from mlflow.tracking import MlflowClient

# How long a command waits for another to finish creating the embedded store's tables.
STORE_LOCK_TIMEOUT_S = 120.0


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
    if not target.tracking_uri.startswith("sqlite:///"):
        return MlflowClient(tracking_uri=target.tracking_uri, registry_uri=target.tracking_uri)
    return _open_embedded_store(target.tracking_uri, Path(target.tracking_uri[len("sqlite:///"):]))


def _open_embedded_store(uri: str, db_file: Path) -> MlflowClient:
    """MLflow creates a SQLite store's tables when a process first opens it, and two processes
    doing that at once fail one (`table _alembic_tmp_experiments already exists`): the first
    opening of both stores (tracking and registry) happens under an OS lock beside the file."""
    db_file.parent.mkdir(parents=True, exist_ok=True)
    with portalocker.Lock(f"{db_file}.lock", timeout=STORE_LOCK_TIMEOUT_S):
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        client.search_registered_models(max_results=1)  # the registry's store opens on first use
    return client


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
