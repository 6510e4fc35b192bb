"""One line per pipeline component on the console: its name when it starts, completed with its
time and the one figure that matters when it ends, read from what it published to ML Metadata.

LocalDagRunner logs `Component <id> is running.` and `Component <id> is finished.` (absl, INFO)
around each component's launch; a filter on absl's logger turns those two records into the line
and keeps absl's other INFO records out of the log, as absl's WARNING verbosity did before.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time

from pipeline.config import LooplineConfig
from pipeline.console import Console

log = logging.getLogger("loopline.pipeline")

RUNNING, FINISHED = "Component %s is running.", "Component %s is finished."  # tfx/orchestration/local/local_dag_runner.py
NAME_WIDTH = 17


@contextlib.contextmanager
def component_lines(config: LooplineConfig, run_id: str, console: Console | None):
    """Writes the lines while the block runs LocalDagRunner; a component that raises ends its
    line with "failed". With no console (`-v`) the lines go to the log only."""
    from absl import logging as absl_logging

    watcher = _Watcher(config, run_id, console)
    absl_logger = logging.getLogger("absl")
    verbosity = absl_logging.get_verbosity()
    absl_logger.addFilter(watcher)
    # Through absl's flag, not the logger's level: Keras lowers and restores the flag around exports.
    absl_logging.set_verbosity(absl_logging.INFO)
    try:
        yield
    except BaseException:
        watcher.failed()
        raise
    finally:
        absl_logging.set_verbosity(verbosity)
        absl_logger.removeFilter(watcher)


class _Watcher(logging.Filter):
    def __init__(self, config: LooplineConfig, run_id: str, console: Console | None):
        super().__init__()
        self.config, self.run_id, self.console = config, run_id, console
        self.running: tuple[str, float] | None = None  # (component, started)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        if record.msg == RUNNING and len(record.args) == 1:
            self.started(str(record.args[0]))
        elif record.msg == FINISHED and len(record.args) == 1:
            self.finished(str(record.args[0]))
        return False

    def started(self, node: str) -> None:
        self.running = (node, time.monotonic())
        log.info("%s started", node)
        if self.console:
            self.console.begin(f"{node:<{NAME_WIDTH}}")

    def finished(self, node: str) -> None:
        seconds = time.monotonic() - self.running[1] if self.running and self.running[0] == node else 0.0
        self.running = None
        try:
            figure = component_figure(self.config, self.run_id, node)
        except Exception as exc:  # noqa: BLE001 - a line without its figure beats a run stopped for it
            figure = f"(figure not read: {exc})"
        self._end(node, f"{seconds:6.1f}s  {figure}".rstrip())

    def failed(self) -> None:
        if self.running:
            node, started = self.running
            self.running = None
            self._end(node, f"{time.monotonic() - started:6.1f}s  failed")

    def _end(self, node: str, rest: str) -> None:
        log.info("%s %s", node, rest.strip())
        if self.console:
            self.console.end(f"{node:<{NAME_WIDTH}}", rest)


def component_figure(config: LooplineConfig, run_id: str, node: str) -> str:
    """What a component's published outputs say, in a few words ("" when they say nothing)."""
    from pipeline.run_metadata import node_outputs, open_store

    found = node_outputs(open_store(config), run_id, config.pipeline.name, node)
    if found is None:
        return "not run"
    state, outputs = found
    words = [_figure(type_name, artifact, config) for type_name, artifact in outputs.items()]
    text = "; ".join(w for w in words if w)
    if state == "CACHED":
        return f"cached; {text}" if text else "cached"
    return text


def _figure(type_name: str, artifact, config: LooplineConfig) -> str:
    props = artifact.custom_properties
    if type_name == "Examples":
        return _examples(artifact)
    if type_name == "ExampleStatistics":
        return _rows(artifact)
    if type_name == "Schema" and "source" in props:
        return f"schema {props['source'].string_value}"
    if type_name == "ExampleAnomalies" and "anomaly_count" in props:
        count = props["anomaly_count"].int_value
        warnings = len(props["warnings"].string_value.splitlines()) if "warnings" in props else 0
        text = "no anomalies" if count == 0 else \
            f"{_count(count, 'anomaly', 'anomalies')}, {'stopping' if props['stop'].int_value else 'accepted'}"
        return text + (f", {_count(warnings, 'warning')}" if warnings else "")
    if type_name == "Model":
        return _model(props, config)
    if type_name == "ModelBlessing" and "blessed" in props:
        if props["blessed"].int_value == 1:
            return "blessed"
        reasons = json.loads(props["reasons"].string_value) if "reasons" in props else []
        failed = [r for r in reasons if r.startswith("FAILED")]
        return "NOT blessed" + (f": {failed[0]}" if failed else "")
    if type_name == "PushedModel" and "pushed" in props:
        return f"version {props['pushed_version'].string_value}" if props["pushed"].int_value == 1 else "not pushed"
    return ""


def _examples(artifact) -> str:
    splits = ", ".join(json.loads(artifact.properties["split_names"].string_value))
    fingerprint = artifact.custom_properties.get("input_fingerprint")
    if fingerprint is None:
        return f"splits {splits}"
    text = fingerprint.string_value  # "split:...,num_files:N,total_bytes:N,..." per input split
    files = sum(int(n) for n in re.findall(r"num_files:(\d+)", text))
    size = sum(int(n) for n in re.findall(r"total_bytes:(\d+)", text))
    return f"splits {splits} from {_count(files, 'file')} ({size / 1000:.1f} kB)"


def _rows(artifact) -> str:
    from validation.statistics import read_statistics

    splits = json.loads(artifact.properties["split_names"].string_value)
    rows = {s: read_statistics(os.path.join(artifact.uri, f"Split-{s}")).num_examples for s in splits}
    return f"{sum(rows.values())} rows (" + ", ".join(f"{s} {n}" for s, n in rows.items()) + ")"


def _model(props, config: LooplineConfig) -> str:
    """Steps trained, the epoch exported and its selecting metric; else the final eval loss."""
    from components.trainer import EXPORTED

    metrics = {k[len("eval_"):]: v.double_value for k, v in props.items() if k.startswith("eval_")}
    steps = int(metrics.pop("steps", 0))
    exported = json.loads(props[EXPORTED].string_value) if EXPORTED in props else {}
    if exported.get("restored"):
        return (f"{steps} steps, exported epoch {exported['epoch']} "
                f"(best {exported['split']} {exported['metric']} {exported['value']:.4g})")
    name = next((m for m in (config.trainer.early_stopping_metric, "weighted_loss", "loss") if m in metrics), None)
    return f"{steps} steps" + (f", eval {name} {metrics[name]:.4g}" if name else "")


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"
