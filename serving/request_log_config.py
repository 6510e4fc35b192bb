"""`serving.request_log`: which served requests are logged, how the log files are cut and how long
they are kept; and the loopline-only file beside models.config that carries these settings to a
running server (`request_log.json`). They cannot go into models.config: stock TF Serving refuses
a models.config holding `logging_config` (it has no log collector), and that file must stay
loadable by it. The server polls the file, so a change applies without a restart.
TensorFlow is imported only where a file is read or written: the configuration loads without it."""
from __future__ import annotations

import json
import os
import posixpath
import uuid

from pydantic import BaseModel, ConfigDict, Field, ValidationError

REQUEST_LOG_FILE = "request_log.json"
REQUEST_LOGS = "request_logs"  # <pipeline.root>/request_logs/<model>/<version>/


class RequestLogConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    sampling_rate: float = Field(0.0, ge=0.0, le=1.0, description=(
        "Share of successful requests logged as TF Serving PredictionLog records, decided per request "
        "(0: off; 1: every request). A model's `logging_config` in models.config overrides it for that model."))
    max_file_mb: float = Field(64.0, gt=0, description=(
        "A log file is closed (and becomes readable) once this many MB of records were written to it."))
    max_file_seconds: float = Field(600.0, gt=0, description=(
        "A log file is closed (and becomes readable) at the latest this many seconds after it was opened: "
        "`loopline monitor` reads closed files only."))
    keep_days: float | None = Field(30.0, gt=0, description=(
        "Closed log files older than this many days are deleted by the server; null keeps them."))
    exclude_features: list[str] = Field([], description=(
        "Features left out of the logged requests (e.g. personal data), by column name."))
    queue_size: int = Field(10000, ge=1, description=(
        "Records waiting for the writer thread; when it is full a record is dropped and counted, "
        "never the request."))


def request_log_dir(pipeline_root: str) -> str:
    return os.path.join(pipeline_root, REQUEST_LOGS)


def request_log_file(serving_root: str) -> str:
    return os.path.join(serving_root, REQUEST_LOG_FILE)


def default_log_dir(serving_root: str) -> str:
    """Where logs go when no file names a folder: beside the serving folder, which is
    `<pipeline.root>/request_logs` for the pipeline's `<pipeline.root>/serving`."""
    parent = posixpath.dirname(serving_root.rstrip("/")) if "://" in serving_root else \
        os.path.dirname(os.path.abspath(serving_root))
    return os.path.join(parent, REQUEST_LOGS)


def write_request_log_file(serving_root: str, config: RequestLogConfig, log_dir: str) -> str:
    """Writes the settings and the log folder, under a temporary name renamed over the old file
    (a polling server never reads half of it)."""
    import tensorflow as tf

    path = request_log_file(serving_root)
    tf.io.gfile.makedirs(serving_root)
    staged = os.path.join(serving_root, f".{REQUEST_LOG_FILE}.{uuid.uuid4().hex[:8]}")
    with tf.io.gfile.GFile(staged, "w") as f:
        f.write(json.dumps({"log_dir": log_dir, **config.model_dump()}, indent=2) + "\n")
    tf.io.gfile.rename(staged, path, overwrite=True)
    return path


def read_request_log_file(path: str) -> tuple[RequestLogConfig, str]:
    """(settings, log folder); ValueError naming the file and the key when it is not valid."""
    import tensorflow as tf

    try:
        with tf.io.gfile.GFile(path) as f:
            data = json.loads(f.read())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("log_dir"), str) or not data["log_dir"]:
        raise ValueError(f"{path}: expected an object with 'log_dir' (a folder) and the serving.request_log keys")
    log_dir = data.pop("log_dir")
    try:
        return RequestLogConfig.model_validate(data), log_dir
    except ValidationError as exc:
        problems = "; ".join(f"'{'.'.join(str(p) for p in e['loc'])}': {e['msg']}" for e in exc.errors())
        raise ValueError(f"{path}: {problems}") from None
