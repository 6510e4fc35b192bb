"""`loopline data report`: the latest run's statistics, schema and anomalies, read back through
ML Metadata, rendered by validation.report."""
from __future__ import annotations

import os

import tensorflow as tf

from pipeline.config import LooplineConfig
from pipeline.local_runner import newest_run_artifacts, open_store
from pipeline.pipeline import metadata_path
from validation.anomalies import problems_of, read_anomalies
from validation.report import write_report
from validation.schema import load_schema
from validation.statistics import read_statistics


def _split_names(artifact) -> list[str]:
    import json

    return json.loads(artifact.properties["split_names"].string_value)


def data_report(config: LooplineConfig, out_dir: str | None = None) -> str:
    """Writes the report of the newest pipeline run; returns the HTML page's path."""
    if not os.path.isfile(metadata_path(config)):
        raise FileNotFoundError(f"no pipeline runs yet under {config.pipeline.root} (run `loopline run` first)")
    run, newest = newest_run_artifacts(open_store(config))
    if run is None:
        raise FileNotFoundError(f"no pipeline runs recorded in {metadata_path(config)}")
    statistics = newest.get("ExampleStatistics")
    if statistics is None:
        raise FileNotFoundError(f"the newest run ({run.name}) has no statistics; did StatisticsGen run?")
    stats = {split: read_statistics(os.path.join(statistics.uri, f"Split-{split}")) for split in _split_names(statistics)}
    schema = load_schema(newest["Schema"].uri) if "Schema" in newest else None
    anomalies_uri = newest["ExampleAnomalies"].uri if "ExampleAnomalies" in newest else None
    problems = []
    if anomalies_uri:
        for split in stats:
            if tf.io.gfile.exists(os.path.join(anomalies_uri, f"Split-{split}", "SchemaDiff.pb")):
                problems += problems_of(split, read_anomalies(os.path.join(anomalies_uri, f"Split-{split}")))
    out_dir = out_dir or os.path.join(config.pipeline.root, "reports", "data", run.name.replace(":", "-"))
    return write_report(out_dir, stats, schema, problems)

