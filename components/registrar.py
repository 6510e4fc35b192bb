"""The pipeline's Registrar: hands the trained (and, when an Evaluator is in the pipeline, blessed)
model to tracking.registration, which logs it to MLflow and registers it.

A class-based component because its executor needs the pipeline run id and its own ML Metadata
execution id (the function-component API does not expose them).
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any

from tfx import types
from tfx.dsl.components.base import base_component, base_executor, executor_spec
from tfx.types import standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter
from tfx.utils import path_utils

from components.splits import EVAL_SPLIT, split_pattern


class RegistrarSpec(ComponentSpec):
    PARAMETERS = {
        "tracking": ExecutionParameter(type=str),  # tracking.target.TrackingTarget as JSON
        "registered_model": ExecutionParameter(type=str),
        "params": ExecutionParameter(type=str),  # the resolved config, flat, as JSON
        "pipeline_name": ExecutionParameter(type=str),
        # Where the orchestrator does not hand the executor its run id (Kubeflow's v2 entry
        # point), the spec passes it: the KFP placeholder {{$.pipeline_job_uuid}}.
        "pipeline_run_id": ExecutionParameter(type=str, optional=True),
    }
    INPUTS = {
        "model": ChannelParameter(type=standard_artifacts.Model),
        "model_run": ChannelParameter(type=standard_artifacts.ModelRun, optional=True),
        "blessing": ChannelParameter(type=standard_artifacts.ModelBlessing, optional=True),
        "pushed_model": ChannelParameter(type=standard_artifacts.PushedModel, optional=True),
        "examples": ChannelParameter(type=standard_artifacts.Examples, optional=True),
        "statistics": ChannelParameter(type=standard_artifacts.ExampleStatistics, optional=True),
        "schema": ChannelParameter(type=standard_artifacts.Schema, optional=True),
        # The data check the run passed (its baseline), for the pushed version's model card.
        "anomalies": ChannelParameter(type=standard_artifacts.ExampleAnomalies, optional=True),
    }
    OUTPUTS = {}


def _one(input_dict, key):
    found = input_dict.get(key) or []
    return found[0] if found else None


def _string_property(artifact, key: str) -> str:
    """A string custom property of an optional artifact ("" when either is absent)."""
    if artifact is None or key not in artifact.mlmd_artifact.custom_properties:
        return ""
    return artifact.mlmd_artifact.custom_properties[key].string_value


def _float_properties(artifact, prefix: str) -> dict[str, float]:
    """An optional artifact's float custom properties named `prefix...`, without the prefix."""
    if artifact is None:
        return {}
    props = artifact.mlmd_artifact.custom_properties
    return {k[len(prefix):]: artifact.get_float_custom_property(k) for k in props if k.startswith(prefix)}


def _sample_records(examples, split: str = EVAL_SPLIT, limit: int = 20) -> list[dict]:
    """A few rows of the split as {feature: value} (None when missing), for the input example."""
    import tensorflow as tf

    files = tf.io.gfile.glob(split_pattern(examples, split))
    records = []
    for raw in tf.data.TFRecordDataset(files, compression_type="GZIP").take(limit).as_numpy_iterator():
        row = {}
        for name, feature in tf.train.Example.FromString(raw).features.feature.items():
            kind = feature.WhichOneof("kind")
            values = list(getattr(feature, kind).value) if kind else []
            if not values:
                row[name] = None
            elif len(values) > 1:  # a list feature: kept whole
                row[name] = values
            elif kind == "bytes_list":
                try:
                    row[name] = values[0].decode("utf-8")
                except UnicodeDecodeError:  # binary, e.g. an encoded image: kept as bytes
                    row[name] = values[0]
            else:
                row[name] = values[0]
        records.append(row)
    return records


class RegistrarExecutor(base_executor.BaseExecutor):
    def Do(self, input_dict: dict[str, list[types.Artifact]], output_dict: dict[str, list[types.Artifact]],
           exec_properties: dict[str, Any]) -> None:
        from tracking.registration import Registration, register_pipeline_run
        from tracking.system_info import current_commit
        from tracking.target import TrackingTarget

        logging.getLogger("loopline").setLevel(logging.INFO)
        model = _one(input_dict, "model")
        model_run = _one(input_dict, "model_run")
        blessing = _one(input_dict, "blessing")
        pushed = _one(input_dict, "pushed_model")
        examples = _one(input_dict, "examples")
        # The Artifact getters, not the raw protos: on Kubeflow, properties arrive as JSON values
        # (the v2 entry point turns every custom property into a struct value).
        props = model.mlmd_artifact.custom_properties
        final = {k[len("eval_"):]: model.get_float_custom_property(k) for k in props if k.startswith("eval_")}
        pushed_version = pushed_path = None
        if pushed is not None and pushed.get_int_custom_property("pushed") == 1:
            pushed_version = pushed.get_string_custom_property("pushed_version")
            pushed_path = pushed.get_string_custom_property("pushed_destination")
        data_dirs = {}
        for key in ("statistics", "schema"):
            artifact = _one(input_dict, key)
            if artifact is not None:
                data_dirs[f"data/{key}"] = artifact.uri
        result = register_pipeline_run(Registration(
            target=TrackingTarget.from_json(exec_properties["tracking"]),
            registered_model=exec_properties["registered_model"],
            pipeline_name=exec_properties["pipeline_name"],
            pipeline_run_id=self._pipeline_run_id(exec_properties),
            execution_id=str(self._context._unique_id or ""),
            model_dir=model.uri,
            saved_model_dir=path_utils.serving_model_path(model.uri),
            model_run_dir=model_run.uri if model_run is not None else None,
            trained_run_id=model.get_string_custom_property("mlflow_run_id") or None,
            params=json.loads(exec_properties["params"]),
            final_metrics=final,
            blessed=bool(blessing.get_int_custom_property("blessed")) if blessing is not None else None,
            serving_version=pushed_version,
            pushed_path=pushed_path,
            git_commit=current_commit(),
            input_records=_sample_records(examples) if examples is not None else [],
            data_dirs=data_dirs,
            accepted_changes=_string_property(blessing, "accepted_changes"),
            blessing_reasons=json.loads(_string_property(blessing, "reasons") or "[]"),
            trivial_metrics=_float_properties(blessing, "trivial_"),
        ))
        logging.getLogger("loopline").info(
            "MLflow run %s; model %s; registered version %s", result.run_id, result.model_uri, result.version)
        if pushed_version:
            _publish_card(input_dict, exec_properties, self._pipeline_run_id(exec_properties), pushed_version,
                          result)


    def _pipeline_run_id(self, exec_properties: dict[str, Any]) -> str:
        run_id = self._context.pipeline_run_id or exec_properties.get("pipeline_run_id") or ""
        if not run_id or run_id.startswith("{{"):
            # Without it, every run would continue the first one's MLflow run (found by this tag).
            raise ValueError(f"Registrar: no pipeline run id (the orchestrator gave {run_id!r}); "
                             "cannot tell this run's MLflow run from another's")
        return run_id


def _publish_card(input_dict, exec_properties: dict[str, Any], pipeline_run_id: str, version: str, result) -> None:
    """The pushed version's per-slice metrics into its MLflow run, and its model card into the
    version folder (assets.extra/model_card) and the run's `model_card/` artifacts. A card that
    cannot be made is a warning: the version is pushed and registered already."""
    import tempfile

    from tracking.lineage import LineageInputs, build_lineage
    from tracking.model_card import card_content, card_folder, curves_of, log_card, read_json, slices_file, write_card
    from tracking.remote_files import copy_tree
    from tracking.slice_metrics import log_slice_metrics
    from tracking.system_info import current_commit
    from tracking.target import TrackingTarget, make_client

    log = logging.getLogger("loopline")

    def mlmd(key):
        found = _one(input_dict, key)
        return found.mlmd_artifact if found is not None else None

    params = json.loads(exec_properties["params"])
    target = TrackingTarget.from_json(exec_properties["tracking"])
    model, pushed, blessing = _one(input_dict, "model"), _one(input_dict, "pushed_model"), _one(input_dict, "blessing")
    destination = pushed.get_string_custom_property("pushed_destination")
    try:
        client = make_client(target)
        slices = read_json(os.path.join(blessing.uri, slices_file())) if blessing is not None else None
        if slices:
            log.info("MLflow: %d per-slice metrics logged", log_slice_metrics(client, result.run_id, slices))
        trained_run = model.get_string_custom_property("mlflow_run_id") or None
        lineage = build_lineage(LineageInputs(
            model_name=os.path.basename(os.path.dirname(destination.rstrip("/"))),
            version=version, pushed=pushed.mlmd_artifact, model=model.mlmd_artifact, examples=mlmd("examples"),
            statistics=mlmd("statistics"), schema=mlmd("schema"), anomalies=mlmd("anomalies"),
            blessing=mlmd("blessing"), model_run=mlmd("model_run"), data_patterns=_data_patterns(params),
            params=params, pipeline_name=exec_properties["pipeline_name"], pipeline_run_id=pipeline_run_id,
            mlflow={"tracking_uri": target.tracking_uri, "run_id": result.run_id, "trained_run_id": trained_run,
                    "registered_model": exec_properties["registered_model"], "registered_version": result.version},
            git_commit=current_commit()))
        model_run = _one(input_dict, "model_run")
        content = card_content(lineage, curves_of(client, trained_run or result.run_id,
                                                  model_run.uri if model_run is not None else None))
        with tempfile.TemporaryDirectory(prefix="loopline-card-") as local:
            write_card(content, local)
            copy_tree(local, card_folder(destination))
            log_card(client, result.run_id, local)
        log.info("model card of version %s: %s", version, card_folder(destination))
    except Exception:  # noqa: BLE001 - the push and the registration stand without a card
        log.warning("no model card for version %s", version, exc_info=True)


def _data_patterns(params: dict[str, str]) -> list[str]:
    """The data files the run read, as the config names them (data.path, data.eval_path)."""
    return [p for p in (params.get("data.path"), params.get("data.eval_path")) if p and p != "None"]


class Registrar(base_component.BaseComponent):
    """Logs the model to MLflow and registers it (only blessed ones when `blessing` is given)."""

    SPEC_CLASS = RegistrarSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(RegistrarExecutor)

    def __init__(self, model, tracking: str, registered_model: str, params: str, pipeline_name: str,
                 model_run=None, blessing=None, pushed_model=None,
                 examples=None, statistics=None, schema=None, pipeline_run_id: str | None = None,
                 anomalies=None):
        super().__init__(RegistrarSpec(
            model=model, model_run=model_run, blessing=blessing, pushed_model=pushed_model,
            examples=examples, statistics=statistics, schema=schema, anomalies=anomalies, tracking=tracking,
            registered_model=registered_model, params=params, pipeline_name=pipeline_name,
            pipeline_run_id=pipeline_run_id,
        ))
