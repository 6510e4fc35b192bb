"""The end of a pipeline run in MLflow: the run gets the resolved config as parameters, system
info, the trainer's/exporter's/data files as artifacts, the model as a logged pyfunc model and,
when blessed, a registered version tagged with where it came from.

The run is found by the tag `loopline.pipeline_run_id` (components may run in separate pods), else
the run the Trainer opened (its id is on the Model artifact) is continued, else one is created.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

import tensorflow as tf

from serving import signature_names as names
from tracking.logged_model import input_example_from_records, log_examples_model, log_saved_model, register
from tracking.metric_sink import UNDELIVERED_FILE, replay
from tracking.remote_files import local_view
from tracking.system_info import system_tags
from tracking.target import TrackingTarget, ensure_experiment, make_client
from tracking.training_run import TAG_MODEL_URI, TAG_PIPELINE, TAG_PIPELINE_RUN_ID

log = logging.getLogger("loopline.tracking")

TAG_TRAINED_IN_RUN = "loopline.trained_in_run"
TAG_REPLAYED = "loopline.replayed_undelivered_metrics"
TAG_GIT_COMMIT = "loopline.git_commit"
TAG_SERVING_VERSION = "loopline.serving_version"
TAG_EXECUTION_ID = "loopline.mlmd_execution_id"
TAG_TRAINER_EXECUTION_ID = "loopline.trainer_execution_id"
TAG_ACCEPTED_CHANGES = "loopline.accepted_changes"  # the run trained on data changes accepted by hand
TAG_BLESSING = "loopline.blessing_reasons"  # the Evaluator's checks in words (JSON list), the trivial floor's included
EXPORT_SUFFIXES = (".tflite", ".json", ".md", ".txt", ".csv")


@dataclass
class Registration:
    target: TrackingTarget
    registered_model: str
    pipeline_name: str
    pipeline_run_id: str
    execution_id: str
    model_dir: str  # the Model artifact's folder
    saved_model_dir: str
    model_run_dir: str | None = None
    trained_run_id: str | None = None  # the run the Trainer wrote metrics to
    params: dict[str, str] = field(default_factory=dict)
    final_metrics: dict[str, float] = field(default_factory=dict)
    blessed: bool | None = None  # None: no Evaluator in the pipeline, register
    serving_version: str | None = None
    pushed_path: str | None = None  # where the Pusher put the served version
    git_commit: str | None = None
    input_records: list[dict] = field(default_factory=list)
    data_dirs: dict[str, str] = field(default_factory=dict)  # artifact path -> folder
    accepted_changes: str = ""  # data changes accepted for this run ("" for none), tagged on the run
    blessing_reasons: list[str] = field(default_factory=list)  # the Evaluator's checks, tagged on the run
    trivial_metrics: dict[str, float] = field(default_factory=dict)  # the trivial floor's eval metrics


@dataclass
class RegistrationResult:
    run_id: str
    model_uri: str
    version: str | None
    replayed_metrics: int


def find_run(client, experiment_id: str, pipeline_run_id: str) -> str | None:
    runs = client.search_runs([experiment_id], f"tags.`{TAG_PIPELINE_RUN_ID}` = '{pipeline_run_id}'", max_results=1)
    return runs[0].info.run_id if runs else None


def _usable_trained_run(client, run_id: str | None, pipeline_run_id: str) -> str | None:
    """The Trainer's run, if it exists and is not claimed by another pipeline run (a cached
    Trainer's run belongs to the pipeline run that trained)."""
    if not run_id:
        return None
    try:
        run = client.get_run(run_id)
    except Exception:
        return None
    owner = run.data.tags.get(TAG_PIPELINE_RUN_ID)
    return run_id if owner in (None, pipeline_run_id) else None


def registered_version_of(client, registered_model: str, model_dir: str) -> str | None:
    try:
        versions = client.search_model_versions(f"name = '{registered_model}'")
    except Exception:
        return None
    for version in versions:
        if version.tags.get(TAG_MODEL_URI) == model_dir:
            return str(version.version)
    return None


def trainer_execution_id(model_dir: str) -> str | None:
    # TFX output URIs are <pipeline root>/<node>/<output key>/<execution id>.
    tail = os.path.basename(os.path.normpath(model_dir))
    return tail if tail.isdigit() else None


def _export_files(model_dir: str) -> list[tuple[str, str]]:
    """(file, artifact folder) for exporter outputs beside the SavedModel: TFLite files, reports.
    Through tf.io.gfile: the model folder may be on gs://..."""
    found = []
    skipped = ("variables", "assets", "assets.extra")
    for folder, _, files in tf.io.gfile.walk(model_dir):
        rel = folder.rstrip("/")[len(model_dir.rstrip("/")):].strip("/")
        if any(part in skipped for part in rel.split("/")):
            continue
        for name in files:
            if name.endswith(EXPORT_SUFFIXES):
                found.append((os.path.join(folder, name), f"export/{rel}" if rel else "export"))
    return found


def _log_folder(client, run_id: str, folder: str | None, artifact_path: str) -> None:
    """Logs a folder's files (through a local copy when it is remote); a missing one is named."""
    if not folder or not tf.io.gfile.isdir(folder):
        log.warning("MLflow: %r not logged: folder %s is missing", artifact_path, folder)
        return
    with local_view(folder) as local:
        client.log_artifacts(run_id, local, artifact_path)


class RegistryUnavailableError(RuntimeError):
    """The tracking server did not answer; the message is one line saying what was already saved
    and how to register it."""


def _unreachable(exc: BaseException) -> bool:
    """Whether the failure is the server not answering (a connection or a timeout), as opposed
    to the server refusing a request."""
    import requests

    seen = exc
    while seen is not None:
        if isinstance(seen, (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                             ConnectionError, TimeoutError)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _unavailable_message(reg: Registration, exc: BaseException) -> str:
    saved = (f"the model was pushed as serving version {reg.serving_version} ({reg.pushed_path})"
             if reg.serving_version else f"the model is saved in {reg.model_dir} (not pushed)")
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    return (f"MLflow tracking server {reg.target.tracking_uri} did not answer ({first}); {saved} but not "
            "registered. Once the server answers, run the pipeline again with the same configuration: every "
            "other step is cached, so only the Registrar runs and registers it.")


def register_pipeline_run(reg: Registration) -> RegistrationResult:
    """Logs and registers; raises RegistryUnavailableError when the server does not answer."""
    try:
        return _register(reg)
    except Exception as exc:
        if not _unreachable(exc):
            raise
        raise RegistryUnavailableError(_unavailable_message(reg, exc)) from None


def _register(reg: Registration) -> RegistrationResult:
    client = make_client(reg.target)
    experiment_id = ensure_experiment(client, reg.target)
    trained = _usable_trained_run(client, reg.trained_run_id, reg.pipeline_run_id)
    run_id = find_run(client, experiment_id, reg.pipeline_run_id) or trained
    if run_id is None:
        tags = {TAG_PIPELINE: reg.pipeline_name, TAG_MODEL_URI: reg.model_dir}
        if reg.trained_run_id:
            tags[TAG_TRAINED_IN_RUN] = reg.trained_run_id
        run_id = client.create_run(experiment_id, tags=tags, run_name=reg.pipeline_name).info.run_id
    _log_tags_and_params(client, run_id, reg)
    replayed = _replay_undelivered(client, reg, trained or run_id)
    if reg.final_metrics:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        client.log_batch(run_id, metrics=[Metric(f"final_eval/{k}", float(v), now, 0) for k, v in reg.final_metrics.items()]
                         + [Metric(f"trivial_floor/{k}", float(v), now, 0) for k, v in reg.trivial_metrics.items()])
    _log_files(client, run_id, reg)
    with local_view(reg.saved_model_dir) as saved_model:  # MLflow copies the model from local files
        model_uri = _log_model(reg, run_id, saved_model)
    version = None
    if reg.blessed is False:
        log.info("MLflow: model not blessed; logged in run %s, not registered", run_id)
    else:
        version = _register_version(client, reg, model_uri, run_id)
        log.info("MLflow: registered %s version %s (run %s)", reg.registered_model, version, run_id)
    client.set_terminated(run_id, "FINISHED")
    return RegistrationResult(run_id, model_uri, str(version) if version is not None else None, replayed)


def _log_model(reg: Registration, run_id: str, saved_model: str) -> str:
    """loopline's export as its pyfunc model; a TFX run_fn's SavedModel as the tf.Example one
    (its signature as the Evaluator calls it, the label columns left out of its inputs)."""
    import tensorflow as tf

    if tf.io.gfile.exists(names.signature_file(saved_model)):
        example = input_example_from_records(saved_model, reg.input_records)
        return log_saved_model(reg.target.tracking_uri, run_id, saved_model, example)
    labels = {reg.params.get("data.label"), reg.params.get("evaluator.label_key")} - {None, "None"}
    return log_examples_model(reg.target.tracking_uri, run_id, saved_model,
                              reg.params.get("evaluator.signature_name", names.DEFAULT), reg.input_records, labels)


def _log_tags_and_params(client, run_id: str, reg: Registration) -> None:
    tags = {TAG_PIPELINE_RUN_ID: reg.pipeline_run_id, TAG_PIPELINE: reg.pipeline_name, **system_tags(reg.git_commit)}
    if reg.accepted_changes:
        tags[TAG_ACCEPTED_CHANGES] = reg.accepted_changes[:5000]  # MLflow caps tag values
    if reg.blessing_reasons:
        tags[TAG_BLESSING] = json.dumps(reg.blessing_reasons)[:5000]
    for key, value in tags.items():
        client.set_tag(run_id, key, value)
    # Parameters are write-once in MLflow: skip the ones a retried execution already logged.
    from mlflow.entities import Param

    logged = client.get_run(run_id).data.params
    new_params = [Param(k, str(v)[:6000]) for k, v in reg.params.items() if k not in logged]
    for start in range(0, len(new_params), 100):
        client.log_batch(run_id, params=new_params[start:start + 100])


def _replay_undelivered(client, reg: Registration, into: str) -> int:
    """Metrics the Trainer could not deliver, into the run it trained in (or this one), once."""
    spill = os.path.join(reg.model_run_dir, UNDELIVERED_FILE) if reg.model_run_dir else None
    if not spill or not tf.io.gfile.exists(spill) or client.get_run(into).data.tags.get(TAG_REPLAYED) == "true":
        return 0
    replayed = replay(client, into, spill)
    client.set_tag(into, TAG_REPLAYED, "true")
    log.info("MLflow: replayed %d metric values the Trainer could not deliver", replayed)
    return replayed


def _log_files(client, run_id: str, reg: Registration) -> None:
    """The Trainer's run folder (once), the export files and the data artifacts."""
    if reg.model_run_dir and not client.list_artifacts(run_id, "trainer"):
        _log_folder(client, run_id, reg.model_run_dir, "trainer")
    for path, artifact_path in _export_files(reg.model_dir):
        with local_view(path) as local:
            client.log_artifact(run_id, local, artifact_path)
    for artifact_path, folder in reg.data_dirs.items():
        _log_folder(client, run_id, folder, artifact_path)


def _register_version(client, reg: Registration, model_uri: str, run_id: str):
    """The registered version of the logged model, tagged with where it came from; a re-executed
    Registrar (config change, retry) re-tags the version it registered before, not a second one."""
    version_tags = {
        TAG_PIPELINE_RUN_ID: reg.pipeline_run_id,
        TAG_EXECUTION_ID: reg.execution_id,
        TAG_MODEL_URI: reg.model_dir,
    }
    trainer_id = trainer_execution_id(reg.model_dir)
    if trainer_id:
        version_tags[TAG_TRAINER_EXECUTION_ID] = trainer_id
    if reg.git_commit:
        version_tags[TAG_GIT_COMMIT] = reg.git_commit
    if reg.serving_version:
        version_tags[TAG_SERVING_VERSION] = reg.serving_version
    existing = registered_version_of(client, reg.registered_model, reg.model_dir)
    if existing is None:
        return register(client, reg.target.tracking_uri, model_uri, reg.registered_model, run_id, version_tags).version
    for key, value in version_tags.items():
        client.set_model_version_tag(reg.registered_model, existing, key, value)
    return existing
