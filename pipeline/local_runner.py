"""Runs the pipeline locally with TFX's LocalDagRunner and ML Metadata on SQLite, one run at a time
per metadata file (pipeline.run_lock), and reads that run (not simply the newest) back."""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

from ml_metadata.proto import metadata_store_pb2
from tfx.dsl.compiler import constants
from tfx.orchestration.local.local_dag_runner import LocalDagRunner
from tfx.orchestration.portable import runtime_parameter_utils

from components.trainer import EXPORTED, TFLITE_DROPPED
from pipeline.checks import check_data
from pipeline.config import LooplineConfig
from pipeline.pipeline import create_pipeline, metadata_path
from pipeline.run_lock import run_lock
from pipeline.run_log import new_run_id
from pipeline.run_metadata import mark_finished, open_store, run_artifacts, run_context

log = logging.getLogger("loopline")


@dataclass
class RunSummary:
    model_name: str
    run_id: str
    version: str | None
    pushed_path: str | None
    saved_model: str | None
    metrics: dict[str, float] = field(default_factory=dict)
    executions: dict[str, str] = field(default_factory=dict)  # component -> COMPLETE/CACHED/...
    seconds: dict[str, float] = field(default_factory=dict)  # component -> wall time, start to publish
    blessed: bool | None = None  # None: no Evaluator ran
    blessing_reasons: list[str] = field(default_factory=list)  # every check, failed ones first
    tflite_dropped: dict[str, str] = field(default_factory=dict)  # variant -> why it missed parity
    data_baseline: str | None = None  # what the data was checked against, in words
    accepted_changes: str = ""  # data changes accepted for this run ("" for none)
    data_warnings: list[str] = field(default_factory=list)  # validation's warnings (e.g. unseen label classes)
    exported: dict = field(default_factory=dict)  # the weights the Trainer exported (its TrainResult.exported)

    def lines(self) -> list[str]:
        out = [f"model      {self.model_name}", f"run        {self.run_id}"]
        if self.data_baseline:
            out.append(f"data       {self.data_baseline}")
        if self.accepted_changes:
            out.append(f"data       changes accepted ({self.accepted_changes})")
        out += [f"data       warning {line}" for line in self.data_warnings]
        out.append(f"version    {self.version or '(not pushed)'}")
        if self.pushed_path:
            out.append(f"pushed to  {self.pushed_path}")
        if self.saved_model:
            out.append(f"SavedModel {self.saved_model}")
        if self.exported:
            from trainer.export import exported_weights

            out.append(f"weights    {exported_weights(self.exported)}")
        if self.blessed is not None:
            out.append(f"blessing   {'blessed' if self.blessed else 'NOT blessed (not pushed)'}")
            out += [f"           - {reason}" for reason in self.blessing_reasons]
        out += [f"tflite     dropped {variant}: {why}" for variant, why in self.tflite_dropped.items()]
        for key, value in sorted(self.metrics.items()):
            out.append(f"eval       {key} = {value:.4g}")
        out.append("components " + ", ".join(f"{k}: {v}" for k, v in self.executions.items()))
        if self.seconds:
            out.append("time       " + ", ".join(f"{k} {v:.1f}s" for k, v in self.seconds.items())
                       + f" (components total {sum(self.seconds.values()):.1f}s)")
        return out


def summarize_run(config: LooplineConfig, run_id: str) -> RunSummary:
    """Reads one pipeline run's executions and artifacts back from ML Metadata."""
    store = open_store(config)
    run = run_context(store, run_id)
    if run is None:
        raise RuntimeError(f"pipeline run {run_id} is not recorded in {metadata_path(config)}")
    newest = run_artifacts(store, run).get

    executions, seconds = {}, {}
    state_names = metadata_store_pb2.Execution.State.Name
    node_type = store.get_context_type("node").id
    for execution in sorted(store.get_executions_by_context(run.id), key=lambda e: e.id):
        # The node id (the component's name in the pipeline, e.g. CsvExampleGen whichever class reads the CSV).
        node = next(c for c in store.get_contexts_by_execution(execution.id) if c.type_id == node_type)
        name = node.name.split(".", 1)[-1]
        executions[name] = state_names(execution.last_known_state)
        # ML Metadata stamps an execution when it is registered and when its outputs are published.
        seconds[name] = max(0, execution.last_update_time_since_epoch - execution.create_time_since_epoch) / 1000

    model = newest("Model")
    pushed = newest("PushedModel")
    metrics, tflite_dropped, exported = {}, {}, {}
    if model is not None:
        metrics = {k[len("eval_"):]: v.double_value for k, v in model.custom_properties.items() if k.startswith("eval_")}
        if TFLITE_DROPPED in model.custom_properties:
            tflite_dropped = json.loads(model.custom_properties[TFLITE_DROPPED].string_value)
        if EXPORTED in model.custom_properties:
            exported = json.loads(model.custom_properties[EXPORTED].string_value)
    blessing = newest("ModelBlessing")
    blessed, reasons = None, []
    if blessing is not None:
        blessed = blessing.custom_properties["blessed"].int_value == 1
        if "reasons" in blessing.custom_properties:
            reasons = json.loads(blessing.custom_properties["reasons"].string_value)
        reasons.sort(key=lambda r: not r.startswith("FAILED"))
    anomalies = newest("ExampleAnomalies")
    data_props = anomalies.custom_properties if anomalies is not None else {}
    pushed_ok = pushed is not None and pushed.custom_properties["pushed"].int_value == 1
    return RunSummary(
        model_name=config.serving.model_name,
        run_id=run_id,
        version=pushed.custom_properties["pushed_version"].string_value if pushed_ok else None,
        pushed_path=pushed.custom_properties["pushed_destination"].string_value if pushed_ok else None,
        saved_model=os.path.join(model.uri, "Format-Serving") if model is not None else None,
        metrics=metrics,
        executions=executions,
        seconds=seconds,
        tflite_dropped=tflite_dropped,
        exported=exported,
        blessed=blessed,
        blessing_reasons=reasons,
        data_baseline=data_props["baseline"].string_value if "baseline" in data_props else None,
        accepted_changes=data_props["accepted_changes"].string_value if "accepted_changes" in data_props else "",
        data_warnings=data_props["warnings"].string_value.splitlines() if "warnings" in data_props else [],
    )


class _RunWithId(LocalDagRunner):
    """LocalDagRunner with the run id chosen here (it makes one up and keeps it to itself), so
    the run can be read back by it: it names the run's pipeline_run context in ML Metadata."""

    def __init__(self, run_id: str):
        super().__init__()
        self.run_id = run_id

    def run_with_ir(self, pipeline, run_options=None):
        runtime_parameter_utils.substitute_runtime_parameter(
            pipeline, {constants.PIPELINE_RUN_ID_PARAMETER_NAME: self.run_id})
        return super().run_with_ir(pipeline, run_options=run_options)


def run_local(config: LooplineConfig, run_id: str | None = None) -> RunSummary:
    """Runs the pipeline under the run lock (the ServingConfigs step writes TF Serving's files
    beside a pushed model) and summarizes this run; `run_id`: default, the time it starts."""
    import tensorflow as tf

    check_data(config)
    tf.io.gfile.makedirs(config.pipeline.root)
    metadata_file = metadata_path(config)
    os.makedirs(os.path.dirname(metadata_file), exist_ok=True)  # SQLite: always local
    run_id = run_id or new_run_id()
    with run_lock(metadata_file, f"loopline run {run_id}", config.pipeline.lock_wait_seconds):
        outcome = "failed: interrupted"  # a KeyboardInterrupt passes the `except` below
        try:
            _RunWithId(run_id).run(create_pipeline(config))
            outcome = "succeeded"
        except Exception as exc:
            outcome = f"failed: {type(exc).__name__}"
            raise
        finally:
            _mark_finished(config, run_id, outcome)
        return summarize_run(config, run_id)


def _mark_finished(config: LooplineConfig, run_id: str, outcome: str) -> None:
    """Marks the run finished for later readers, never hiding the run's own error."""
    try:
        mark_finished(open_store(config), run_id, outcome)
    except Exception as exc:  # noqa: BLE001
        log.warning("could not mark run %s finished in %s: %s", run_id, metadata_path(config), exc)
