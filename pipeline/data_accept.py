"""`loopline data accept`: makes the data of the newest finished run, stopped by data validation, the
new baseline, so the next run on that data trains (validation.baseline). It holds the run lock, so
no run starts meanwhile. The user's files are never edited: with `data.schema` set, the schema diff
to apply by hand is printed instead."""
from __future__ import annotations

import json
import os

from pipeline.config import ConfigError, LooplineConfig
from pipeline.pipeline import data_baseline_dir, metadata_path
from pipeline.run_lock import run_lock
from pipeline.run_metadata import newest_finished_run, open_store, run_artifacts
from validation.anomalies import problems_of, read_anomalies
from validation.baseline import read_baseline, write_baseline
from validation.run_validation import TRAIN
from validation.schema import infer_schema, load_schema, schema_changes, schema_text_diff
from validation.statistics import read_statistics


def _stopped_run(config: LooplineConfig):
    """The newest finished run's (name, statistics artifact, anomalies artifact); ConfigError unless
    data validation stopped it."""
    store = open_store(config, read_only=True)
    run = newest_finished_run(store)
    newest = run_artifacts(store, run) if run is not None else {}
    anomalies = newest.get("ExampleAnomalies")
    if run is None or anomalies is None or "ExampleStatistics" not in newest:
        raise ConfigError(f"the newest finished run under {config.pipeline.root} has no data validation results "
                          "to accept")
    props = anomalies.custom_properties
    if "stop" not in props or props["stop"].int_value != 1:
        raise ConfigError(f"the newest run ({run.name}) was not stopped by data validation: nothing to accept")
    within = props["within_run_report"].string_value if "within_run_report" in props else ""
    only_within = "stopping_against_baseline" in props and props["stopping_against_baseline"].int_value == 0
    if within and only_within and not config.data.schema:  # a curated schema's stop: the diff to apply
        raise ConfigError(f"the newest run ({run.name}) was stopped by problems within the run, which acceptance "
                          f"does not let through (fix the data or the schema):\n{within}")
    return run.name, newest["ExampleStatistics"], anomalies


def accept_data(config: LooplineConfig) -> list[str]:
    """Records the stopped run's statistics (and the schema inferred from them) as the baseline;
    returns the lines to print."""
    if not os.path.isfile(metadata_path(config)):
        raise ConfigError(f"no pipeline runs yet under {config.pipeline.root} (run `loopline run` first)")
    with run_lock(metadata_path(config), "loopline data accept", config.pipeline.lock_wait_seconds):
        return _accept(config)


def _accept(config: LooplineConfig) -> list[str]:
    run_name, statistics, anomalies = _stopped_run(config)
    splits = json.loads(statistics.properties["split_names"].string_value)
    stats = {split: read_statistics(os.path.join(statistics.uri, f"Split-{split}")) for split in splits}
    schema = infer_schema(stats[TRAIN] if TRAIN in stats else stats[splits[0]], config.validation)
    problems = [p for split in splits for p in problems_of(split, read_anomalies(os.path.join(anomalies.uri, f"Split-{split}")))]
    accepted = f"run {run_name}: " + "; ".join(f"[{p.split}] {p.feature}: {p.kind}" for p in problems)
    directory = data_baseline_dir(config)
    previous = read_baseline(directory)  # an unreadable one stops here, named, before anything is written
    location = write_baseline(directory, schema, stats, {"statistics": statistics.uri, "pipeline_run": run_name,
                                                         "schema": "inferred by loopline data accept"}, accepted)
    lines = [f"accepted   {accepted}", f"baseline   {location}"]
    within = anomalies.custom_properties["within_run_report"].string_value \
        if "within_run_report" in anomalies.custom_properties else ""
    if within:
        lines.append("note       problems within the run (a curated schema's checks included) are not accepted "
                     "and will stop the next run again until fixed:\n" + within)
    if previous is not None:
        changes = schema_changes(previous.schema, schema)
        lines += ["schema     changes against the previous baseline:" if changes else "schema     unchanged"]
        lines += [f"           {line}" for line in changes]
    if config.data.schema:
        curated = load_schema(config.data.schema)
        diff = schema_text_diff(curated, schema, config.data.schema, "schema inferred from the accepted data")
        lines += [f"data.schema  {config.data.schema} is your file and stays as it is; the next runs still check "
                  "against it. Apply by hand what you accept:", diff or "(no difference)"]
    if within:
        lines.append("next run   stops again on the problems above until they are fixed")
    else:
        lines.append("next run   trains on this data; when the champion cannot read it, the new model is blessed on "
                     "the evaluator's thresholds alone")
    return lines
