"""`loopline lineage` and `loopline card`: a pushed version's lineage found again in ML Metadata
(the Pusher's execution that wrote the version, and from it the Model, the Trainer, the Examples
and the ExampleGen's input files, the statistics and the data check the Evaluator was given) and
in MLflow (the run, the registered version, the git commit), rendered by tracking.lineage and
tracking.model_card."""
from __future__ import annotations

import json
import os

from ml_metadata.proto import metadata_store_pb2

from pipeline.config import LooplineConfig
from pipeline.pipeline import metadata_path
from pipeline.run_metadata import RUN_CONTEXT, open_store

INPUT, OUTPUT = metadata_store_pb2.Event.INPUT, metadata_store_pb2.Event.OUTPUT


class LineageError(Exception):
    """A version that cannot be found; the message is one line naming it."""


def serving_base_of(config: LooplineConfig, model: str) -> str:
    return os.path.join(config.pipeline.root, "serving", model)


def pushed_versions(config: LooplineConfig, model: str) -> list[int]:
    from serving.model_config import available_versions

    base = serving_base_of(config, model)
    return available_versions(base) if _isdir(base) else []


def _isdir(path: str) -> bool:
    import tensorflow as tf

    return tf.io.gfile.isdir(path)


def choose_version(config: LooplineConfig, model: str, version: int | None) -> int:
    """`version`, checked to be on disk; None: the newest pushed version."""
    versions = pushed_versions(config, model)
    if not versions:
        raise LineageError(f"no pushed versions of model {model!r} under {serving_base_of(config, model)}")
    if version is None:
        return versions[-1]
    if version not in versions:
        raise LineageError(f"model {model!r} has no pushed version {version} (pushed: "
                           f"{', '.join(map(str, versions[-10:]))})")
    return version


class _Graph:
    """The few ML Metadata walks a lineage needs."""

    def __init__(self, store):
        self.store = store
        self.type_names = {t.id: t.name for t in store.get_artifact_types()}

    def events(self, execution_id: int, kind) -> dict[str, metadata_store_pb2.Artifact]:
        ids = [e.artifact_id for e in self.store.get_events_by_execution_ids([execution_id]) if e.type == kind]
        return {self.type_names[a.type_id]: a for a in self.store.get_artifacts_by_id(ids)}

    def producer(self, artifact) -> metadata_store_pb2.Execution | None:
        ids = [e.execution_id for e in self.store.get_events_by_artifact_ids([artifact.id]) if e.type == OUTPUT]
        return self.store.get_executions_by_id(ids[:1])[0] if ids else None

    def consumers(self, artifact) -> list[metadata_store_pb2.Execution]:
        ids = [e.execution_id for e in self.store.get_events_by_artifact_ids([artifact.id]) if e.type == INPUT]
        return self.store.get_executions_by_id(ids)

    def inputs_of_producer(self, artifact) -> tuple[metadata_store_pb2.Execution | None, dict]:
        execution = self.producer(artifact) if artifact is not None else None
        return execution, self.events(execution.id, INPUT) if execution is not None else {}

    def run_id(self, execution) -> str:
        run_type = self.store.get_context_type(RUN_CONTEXT).id
        runs = [c.name for c in self.store.get_contexts_by_execution(execution.id) if c.type_id == run_type]
        return runs[0] if runs else ""


def _pushed_artifact(graph: _Graph, destination: str):
    """The push that wrote `destination`; else (a root moved since) the push of that model name
    and version number."""
    def recorded(artifact) -> str:
        props = artifact.custom_properties
        return props["pushed_destination"].string_value.rstrip("/") if "pushed_destination" in props else ""

    pushes = [a for a in graph.store.get_artifacts_by_type("PushedModel") if recorded(a)]
    found = [a for a in pushes if recorded(a) == destination.rstrip("/")]
    tail = destination.rstrip("/").split("/")[-2:]
    found = found or [a for a in pushes if recorded(a).split("/")[-2:] == tail]
    return max(found, key=lambda a: a.id, default=None)


def _execution_property(execution, key: str, default: str = "") -> str:
    if execution is None:
        return default
    for props in (execution.properties, execution.custom_properties):
        if key in props:
            return props[key].string_value
    return default


def _data_patterns(example_gen) -> list[str]:
    """What the ExampleGen read: its input_base joined with each split's pattern."""
    base = _execution_property(example_gen, "input_base")
    config = json.loads(_execution_property(example_gen, "input_config", "{}") or "{}")
    return [os.path.join(base, split["pattern"]) for split in config.get("splits", [])] if base else []


def _artifacts_of_version(graph: _Graph, pushed) -> dict:
    """The artifacts and executions upstream and downstream of the push, by the roles the lineage names."""
    pusher, pushed_inputs = graph.inputs_of_producer(pushed)
    model, blessing = pushed_inputs.get("Model"), pushed_inputs.get("ModelBlessing")
    trainer, trainer_inputs = graph.inputs_of_producer(model)
    _, evaluator_inputs = graph.inputs_of_producer(blessing)
    examples = trainer_inputs.get("Examples") or evaluator_inputs.get("Examples")
    example_gen = graph.producer(examples) if examples is not None else None
    registrar = next((e for e in graph.consumers(pushed)
                      if graph.store.get_execution_types_by_id([e.type_id])[0].name.endswith("Registrar")), None)
    return {
        "pushed": pushed, "model": model, "blessing": blessing, "examples": examples,
        "model_run": graph.events(trainer.id, OUTPUT).get("ModelRun") if trainer is not None else None,
        "schema": trainer_inputs.get("Schema"),
        "statistics": evaluator_inputs.get("ExampleStatistics"),
        "anomalies": evaluator_inputs.get("ExampleAnomalies"),
        "example_gen": example_gen, "registrar": registrar,
        "run_id": graph.run_id(pusher) if pusher is not None else "",
    }


def _mlflow_record(config: LooplineConfig, registrar, run_id: str, version: str, trained_run: str | None):
    """(the MLflow facts of the lineage, the client) from the registry the Registrar used; ({}, None)
    without MLflow."""
    from pipeline.tracking_setup import registered_model_name, tracking_target
    from tracking.registration import TAG_GIT_COMMIT, TAG_SERVING_VERSION
    from tracking.target import TrackingTarget, make_client

    recorded = _execution_property(registrar, "tracking")
    target = TrackingTarget.from_json(recorded) if recorded else tracking_target(config)
    if target is None:
        return {}, None
    client = make_client(target)
    name = _execution_property(registrar, "registered_model") or registered_model_name(config)
    versions = [v for v in client.search_model_versions(f"name = '{name}'")
                if v.tags.get(TAG_SERVING_VERSION) == version]
    registered = max(versions, key=lambda v: int(v.version), default=None)
    mlflow_run = registered.run_id if registered is not None else None
    if mlflow_run is None and run_id:
        from tracking.registration import find_run
        from tracking.target import ensure_experiment

        mlflow_run = find_run(client, ensure_experiment(client, target), run_id)
    tags = client.get_run(mlflow_run).data.tags if mlflow_run else {}
    return {"tracking_uri": target.tracking_uri, "run_id": mlflow_run, "trained_run_id": trained_run,
            "registered_model": name, "registered_version": registered.version if registered else None,
            "git_commit": tags.get(TAG_GIT_COMMIT)}, client


def version_lineage(config: LooplineConfig, model: str, version: int) -> tuple[dict, object]:
    """The lineage of `model`'s pushed `version` (and the MLflow client, None without one)."""
    from serving.push import version_path
    from tracking.lineage import LineageInputs, build_lineage, prop

    store = open_store(config, read_only=True)
    graph = _Graph(store)
    destination = version_path(serving_base_of(config, model), version)
    pushed = _pushed_artifact(graph, destination)
    if pushed is None:
        raise LineageError(f"version {version} of {model!r} ({destination}) has no push recorded in "
                           f"{metadata_path(config)}")
    found = _artifacts_of_version(graph, pushed)
    params = json.loads(_execution_property(found["registrar"], "params", "{}") or "{}") \
        or {k: str(v) for k, v in config.flat().items()}
    try:
        mlflow, client = _mlflow_record(config, found["registrar"], found["run_id"], str(version),
                                        prop(found["model"], "mlflow_run_id") or None)
    except Exception as exc:  # noqa: BLE001 - ML Metadata's part of the lineage stands without MLflow's
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        mlflow, client = {"error": f"MLflow could not be read: {first}"}, None
    lineage = build_lineage(LineageInputs(
        model_name=model, version=str(version), pushed=pushed, model=found["model"], examples=found["examples"],
        statistics=found["statistics"], schema=found["schema"], anomalies=found["anomalies"],
        blessing=found["blessing"], model_run=found["model_run"],
        data_patterns=_data_patterns(found["example_gen"]), params=params,
        pipeline_name=_execution_property(found["registrar"], "pipeline_name") or config.pipeline.name,
        pipeline_run_id=found["run_id"], mlflow={k: v for k, v in mlflow.items() if k != "git_commit"},
        git_commit=mlflow.get("git_commit")))
    return lineage, client


def write_version_card(config: LooplineConfig, model: str, version: int, out: str | None) -> str:
    """Writes `version`'s card into `out` (default: its place in the version folder); returns the page."""
    from tracking.model_card import card_content, card_folder, curves_of, write_card

    lineage, client = version_lineage(config, model, version)
    mlflow = lineage["mlflow"] or {}
    curves = curves_of(client, mlflow.get("trained_run_id") or mlflow.get("run_id"),
                       (lineage.get("trainer_run") or {}).get("uri"))
    from serving.model_config import version_path

    # The version folder as it is now (the recorded destination may be under a root since moved).
    folder = out or card_folder(version_path(serving_base_of(config, model), version))
    return write_card(card_content(lineage, curves), folder)
