"""`loopline data report`: the newest finished run's statistics, schema and anomalies, read back
through ML Metadata (read-only), next to the baseline the run was checked against (its statistics
overlaid, the drift figures, the schema changes), rendered by validation.report."""
from __future__ import annotations

import json
import os

import tensorflow as tf
from tensorflow_metadata.proto.v0 import anomalies_pb2

from pipeline.config import LooplineConfig
from pipeline.pipeline import metadata_path
from pipeline.run_metadata import newest_finished_run, open_store, run_artifacts
from trainer.predicted import EVAL_PREDICTIONS
from validation.anomalies import ANOMALIES_FILE, problems_of, read_anomalies
from validation.baseline import read_baseline_folder
from validation.report import BaselineView, write_report
from validation.run_validation import TRAIN
from validation.schema import infer_schema, load_schema, schema_changes
from validation.statistics import read_statistics

MEASURES = {anomalies_pb2.DriftSkewInfo.Measurement.L_INFTY: "L-infinity",
            anomalies_pb2.DriftSkewInfo.Measurement.JENSEN_SHANNON_DIVERGENCE: "Jensen-Shannon"}


def _split_names(artifact) -> list[str]:
    return json.loads(artifact.properties["split_names"].string_value)


def _baseline_view(config: LooplineConfig, anomalies_artifact, anomalies: dict, stats: dict) -> BaselineView | None:
    props = anomalies_artifact.custom_properties if anomalies_artifact is not None else {}
    location = props["baseline_location"].string_value if "baseline_location" in props else ""
    if not location:
        return None
    baseline = read_baseline_folder(location)
    drift = {}
    for split, found in anomalies.items():
        for info in found.drift_skew_info:
            for m in info.drift_measurements:
                drift[(split, "/".join(info.path.step))] = (MEASURES.get(m.type, "?"), m.value, m.threshold)
    new_schema = infer_schema(stats[TRAIN] if TRAIN in stats else next(iter(stats.values())), config.validation)
    data_splits = {k: v for k, v in baseline.statistics.items() if k != EVAL_PREDICTIONS}  # the model's, not data
    return BaselineView(props["baseline"].string_value, data_splits, drift,
                        schema_changes(baseline.schema, new_schema))


def data_report(config: LooplineConfig, out_dir: str | None = None) -> str:
    """Writes the report of the newest finished pipeline run (ML Metadata opened read-only);
    returns the HTML page's path."""
    store = open_store(config, read_only=True)
    run = newest_finished_run(store)
    if run is None:
        raise FileNotFoundError(f"no finished pipeline run recorded in {metadata_path(config)}")
    newest = run_artifacts(store, run)
    statistics = newest.get("ExampleStatistics")
    if statistics is None:
        raise FileNotFoundError(f"the newest run ({run.name}) has no statistics; did StatisticsGen run?")
    stats = {split: read_statistics(os.path.join(statistics.uri, f"Split-{split}")) for split in _split_names(statistics)}
    schema = load_schema(newest["Schema"].uri) if "Schema" in newest else None
    anomalies_artifact = newest.get("ExampleAnomalies")
    anomalies = {}
    if anomalies_artifact is not None:
        for split in stats:
            if tf.io.gfile.exists(os.path.join(anomalies_artifact.uri, f"Split-{split}", ANOMALIES_FILE)):
                anomalies[split] = read_anomalies(os.path.join(anomalies_artifact.uri, f"Split-{split}"))
    problems = [p for split, found in anomalies.items() for p in problems_of(split, found)]
    baseline = _baseline_view(config, anomalies_artifact, anomalies, stats)
    out_dir = out_dir or os.path.join(config.pipeline.root, "reports", "data", run.name.replace(":", "-"))
    return write_report(out_dir, stats, schema, problems, baseline)
