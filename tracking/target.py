"""Where runs go: the tracking URI, experiment and HTTP limits, resolved once by the pipeline and
handed to components as JSON (components may run in other processes or pods)."""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
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
    opening of both stores (tracking and registry) happens under an OS lock beside the file.
    A new store starts as a copy of the empty one MLflow made for this MLflow version
    (empty_store_template), which MLflow then opens as usual (it checks the schema's revision)."""
    db_file.parent.mkdir(parents=True, exist_ok=True)
    with portalocker.Lock(f"{db_file}.lock", timeout=STORE_LOCK_TIMEOUT_S):
        if not db_file.exists():
            template = empty_store_template()
            if template is not None:
                shutil.copyfile(template, db_file)
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        client.search_registered_models(max_results=1)  # the registry's store opens on first use
    return client


def template_dir() -> Path:
    """Where the empty store templates are kept: $LOOPLINE_CACHE_DIR, else the user's cache folder."""
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "loopline"
    return Path(os.environ.get("LOOPLINE_CACHE_DIR") or default)


def empty_store_template() -> Path | None:
    """An empty SQLite store with MLflow's tables, made by MLflow itself (its initial tables and
    every Alembic migration, about a hundred: seconds of CPU) once per MLflow version and kept
    in template_dir(); each new store is a copy. None when the folder cannot be written: MLflow
    then makes the new store's tables itself."""
    import mlflow
    from mlflow.store.db.utils import _initialize_tables, create_sqlalchemy_engine_with_retry

    template = template_dir() / f"mlflow-{mlflow.__version__}-empty-store.db"
    if template.exists():
        return template
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=template.parent) as tmp:
            made = Path(tmp) / template.name
            engine = create_sqlalchemy_engine_with_retry(f"sqlite:///{made}")
            _initialize_tables(engine)
            engine.dispose()
            os.replace(made, template)  # whole or not at all, also when two processes make it at once
    except OSError as exc:
        logging.getLogger("loopline.tracking").info("no empty store template in %s (%s): MLflow creates the tables",
                                                    template.parent, exc)
        return None
    return template


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
