"""`loopline monitor`: what the served model saw in a time window, checked with the pipeline's own
data-validation code against the data the served version was trained on.

For each version that answered requests in the window (closed request-log files only):
- the logged requests become tf.Examples (pipeline.logged_requests) and statistics
  (validation.statistics, as StatisticsGen computes them);
- the schema checks of the validator (missing features, types, values outside a domain or a
  range, new columns) against the version's baseline schema (validation.baseline: recorded when
  it was pushed), less the label columns and `serving.request_log.exclude_features`;
- training/serving skew against the baseline's train split, and drift against the previous
  monitored window of the same version, with the validator's measures and thresholds
  (validation.anomalies: L-infinity distance, Jensen-Shannon divergence);
- the predicted classes or values against the eval split's labels (drift thresholds);
- with `--labels`, the live metrics of the joined requests (pipeline.monitor_labels).
Written under `<pipeline.root>/monitoring/<model>/<version>/<window>/`: the HTML data report
(training vs served), `summary.json`, the statistics and anomalies in TFDV's layout (the next
window's drift reads them); logged to the version's MLflow run at the window's time. A threshold
crossed, or a check that cannot be made, fails the command (exit 1).
"""
from __future__ import annotations

import datetime
import json
import os
import re
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf
from tensorflow_metadata.proto.v0 import anomalies_pb2, schema_pb2, statistics_pb2

from pipeline.config import LooplineConfig
from pipeline.logged_requests import ServedModel, logged_examples, logged_predictions
from pipeline.monitor_labels import Labels, LiveMetrics, join_labels
from serving.request_log_config import request_log_dir
from serving.request_log_files import read_window, stamp
from trainer.predicted import EVAL_PREDICTIONS, predicted_examples
from validation.anomalies import Problem, check_drift, check_skew, validate_split, write_anomalies
from validation.baseline import Baseline, baseline_dir, baseline_of_version
from validation.report import BaselineView, write_report
from validation.statistics import ExampleStatistics, read_statistics, write_statistics

SERVED, PREDICTIONS = "served", "predictions"
MEASURES = {anomalies_pb2.DriftSkewInfo.Measurement.L_INFTY: "L-infinity",
            anomalies_pb2.DriftSkewInfo.Measurement.JENSEN_SHANNON_DIVERGENCE: "Jensen-Shannon"}
_DURATION = re.compile(r"P(?:(\d+)W)?(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d*)?)S)?)?")


@dataclass
class Window:
    since: float
    until: float

    @property
    def name(self) -> str:
        return f"{stamp(self.since)}--{stamp(self.until)}"

    def describe(self) -> str:
        iso = lambda t: datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds")
        return f"{iso(self.since)} .. {iso(self.until)}"


def _moment(text: str) -> float:
    """An ISO 8601 date or date-time; without a zone, UTC."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO 8601 time (e.g. 2026-12-01T00:00:00Z) or duration (e.g. P1D, PT6H)") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)).timestamp()


def parse_window(since: str | None, until: str | None, now: float) -> Window:
    """`--until` (default now) and `--since`: a time, or an ISO 8601 duration before `until`
    (default P1D, the day before)."""
    end = _moment(until) if until else now
    text = since or "P1D"
    match = _DURATION.fullmatch(text) if text.startswith("P") and len(text) > 1 else None
    if match:
        weeks, days, hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
        start = end - (((weeks * 7 + days) * 24 + hours) * 60 + minutes) * 60 - seconds
    else:
        start = _moment(text)
    if start >= end:
        raise ValueError(f"the window is empty: --since {text} is not before --until ({Window(start, end).describe()})")
    return Window(start, end)


@dataclass
class ServedWindow:
    """One version's logged requests in the window, folded into statistics as they are read."""
    version: int
    model: ServedModel
    wanted: set[str]  # request ids with labels: their answers are kept for the join
    features: ExampleStatistics = field(default_factory=ExampleStatistics)
    predictions: ExampleStatistics = field(default_factory=ExampleStatistics)
    requests: int = 0
    examples: int = 0
    answers: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def add(self, record) -> None:
        examples = logged_examples(record.log, self.model)
        predicted = logged_predictions(record.log, self.model)
        self.requests += 1
        self.examples += len(examples)
        for example in examples:
            self.features.add(example.SerializeToString())
        for example in predicted_examples(predicted, self.model.heads):
            self.predictions.add(example.SerializeToString())
        if record.request_id in self.wanted:
            self.answers[record.request_id] = predicted


@dataclass
class VersionCheck:
    version: int
    requests: int
    examples: int
    problems: list[Problem]
    measures: dict[str, dict[str, dict]]  # "skew" / "drift" / "predictions" -> feature -> measure, value, threshold
    baseline: str = ""
    out_dir: str = ""
    live: LiveMetrics | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def summary(self, window: Window, model: str) -> dict:
        return {
            "model": model, "version": self.version, "window": {"since": window.since, "until": window.until,
                                                                "text": window.describe()},
            "passed": self.passed, "requests": self.requests, "examples": self.examples, "baseline": self.baseline,
            "failed_features": sorted({p.feature for p in self.problems}),
            "problems": [{"split": p.split, "feature": p.feature, "kind": p.kind, "description": p.description}
                         for p in self.problems],
            **self.measures, "live_metrics": self.live.to_json() if self.live else None, "notes": self.notes,
        }


def _measures(anomalies: anomalies_pb2.Anomalies, skew: bool) -> dict[str, dict]:
    out = {}
    for info in anomalies.drift_skew_info:
        for m in (info.skew_measurements if skew else info.drift_measurements):
            out["/".join(info.path.step)] = {"measure": MEASURES.get(m.type, "?"), "value": round(m.value, 6),
                                             "threshold": m.threshold}
    return out


def serving_schema(schema: schema_pb2.Schema, model: ServedModel, excluded: list[str]) -> schema_pb2.Schema:
    """The baseline schema as served requests hold it (TFDV's SERVING environment): no label
    columns, no features the server leaves out of the log."""
    out = schema_pb2.Schema()
    out.CopyFrom(schema)
    drop = model.label_columns | set(excluded)
    del out.feature[:]
    out.feature.extend(f for f in schema.feature if f.name not in drop)
    return out


def label_schema(schema: schema_pb2.Schema, model: ServedModel) -> schema_pb2.Schema:
    out = schema_pb2.Schema()
    out.feature.extend(f for f in schema.feature if f.name in model.label_columns)
    return out


def monitoring_dir(root: str, model: str, version: int) -> str:
    return os.path.join(root, "monitoring", model, str(version))


def previous_window(root: str, model: str, version: int, window: Window) -> tuple[str, statistics_pb2.DatasetFeatureStatistics] | None:
    """The served statistics of the latest earlier window of this version (ended by `since`)."""
    folder = monitoring_dir(root, model, version)
    if not tf.io.gfile.isdir(folder):
        return None
    earlier = []
    for name in (e.rstrip("/") for e in tf.io.gfile.listdir(folder)):
        path = os.path.join(folder, name, "summary.json")
        if "--" in name and tf.io.gfile.exists(path):
            with tf.io.gfile.GFile(path) as f:
                until = json.loads(f.read())["window"]["until"]
            if until <= window.since:
                earlier.append((until, name))
    if not earlier:
        return None
    name = max(earlier)[1]
    return name, read_statistics(os.path.join(folder, name, f"Split-{SERVED}"))


def check_version(config: LooplineConfig, window: Window, served: ServedWindow, baseline: Baseline) -> VersionCheck:
    """The version's window against its baseline (and the previous window): every check, measured."""
    stats, predictions = served.features.result(SERVED), served.predictions.result(PREDICTIONS)
    schema = serving_schema(baseline.schema, served.model, config.serving.request_log.exclude_features)
    anomalies, problems = validate_split(SERVED, stats, schema, config.validation, guess_numeric_text=False)
    check = VersionCheck(served.version, served.requests, served.examples, problems, {}, baseline.describe())
    if "train" in baseline.statistics:
        problems += check_skew(SERVED, stats, baseline.statistics["train"], schema, config.validation, anomalies,
                               against="the training data (the baseline's 'train' split)")
    else:
        problems.append(Problem(SERVED, "(dataset)", "COMPARATOR_CONTROL_DATA_MISSING",
                                f"the baseline has no 'train' split ({sorted(baseline.statistics)}): skew not checked."))
    before = previous_window(config.pipeline.root, config.serving.model_name, served.version, window)
    if before is not None:
        problems += check_drift(SERVED, stats, before[1], schema, config.validation, anomalies,
                                against=f"the previous window ({before[0]})")
    else:
        check.notes.append("no earlier window of this version: drift not checked (skew was)")
    predicted = anomalies_pb2.Anomalies()
    reference = EVAL_PREDICTIONS if EVAL_PREDICTIONS in baseline.statistics else "eval"
    if reference == "eval":
        check.notes.append("the baseline holds no eval-split predictions (pushed before they were recorded): "
                           "served predictions compared with the eval split's labels")
    if reference in baseline.statistics:
        words = "its predictions on the eval split" if reference == EVAL_PREDICTIONS else "the eval split's labels"
        problems += check_drift(PREDICTIONS, predictions, baseline.statistics[reference],
                                label_schema(baseline.schema, served.model), config.validation, predicted, against=words)
    check.measures = {"skew": _measures(anomalies, True), "drift": _measures(anomalies, False),
                      "predictions": _measures(predicted, False)}
    check.out_dir = os.path.join(monitoring_dir(config.pipeline.root, config.serving.model_name, served.version), window.name)
    _write_outputs(check, stats, predictions, anomalies, baseline)
    return check


def _write_outputs(check: VersionCheck, stats, predictions, anomalies, baseline: Baseline) -> None:
    """Statistics and anomalies in TFDV's layout, and the HTML data report: served vs training."""
    write_statistics(os.path.join(check.out_dir, f"Split-{SERVED}"), stats)
    write_statistics(os.path.join(check.out_dir, f"Split-{PREDICTIONS}"), predictions)
    write_anomalies(os.path.join(check.out_dir, f"Split-{SERVED}"), anomalies)
    figures = {(f"{kind} ({'vs training' if kind == 'skew' else 'vs previous window' if kind == 'drift' else 'vs eval'})",
                feature): (m["measure"], m["value"], m["threshold"])
               for kind, measured in check.measures.items() for feature, m in measured.items()}
    view = BaselineView(check.baseline, dict(baseline.statistics), figures, [])
    write_report(check.out_dir, {SERVED: stats, "served predictions": predictions}, baseline.schema, check.problems, view)


@dataclass
class MonitorResult:
    window: Window
    checks: list[VersionCheck]
    failures: list[str]  # what could not be checked or recorded, in words
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures and all(c.passed for c in self.checks)


def monitor(config: LooplineConfig, window: Window, labels: Labels | None = None) -> MonitorResult:
    """Checks every version that answered in the window; see the module's docstring. `labels`:
    read_labels' file, for the live metrics."""
    model = config.serving.model_name
    served, failures = read_served(config, window, labels.request_ids if labels is not None else set())
    result = MonitorResult(window, [], failures)
    if not served and not failures:
        result.failures.append(
            f"no logged requests of model {model} in {window.describe()} under {request_log_dir(config.pipeline.root)} "
            "(is serving.request_log.sampling_rate above 0? A log file is read once closed: after "
            "serving.request_log.max_file_seconds, or when the server stops)")
    for version, window_of_version in sorted(served.items()):
        baseline = baseline_of_version(baseline_dir(config.pipeline.root, model), version)
        if baseline is None:
            result.failures.append(f"version {version}: no baseline names it under "
                                   f"{baseline_dir(config.pipeline.root, model)} (written when a run pushes a version); "
                                   "its requests cannot be checked")
            continue
        check = check_version(config, window, window_of_version, baseline)
        if labels is not None:
            check.live = join_labels(labels, window_of_version.answers, window_of_version.model.heads)
            check.problems += live_threshold_problems(check.live, config)
        result.checks.append(check)
    result.notes += record_in_mlflow(config, result)
    for check in result.checks:  # last: the next window's drift looks for it
        with tf.io.gfile.GFile(os.path.join(check.out_dir, "summary.json"), "w") as f:
            f.write(json.dumps(check.summary(window, model), indent=2) + "\n")
    return result


def read_served(config: LooplineConfig, window: Window, wanted: set[str]) -> tuple[dict[int, ServedWindow], list[str]]:
    """The window's logged records, by the version that answered; versions whose export cannot be
    read (its description decodes the requests) are named, not checked."""
    model = config.serving.model_name
    served: dict[int, ServedWindow] = {}
    unreadable: dict[int, str] = {}
    for record in read_window(request_log_dir(config.pipeline.root), model, window.since, window.until):
        if record.version in unreadable:
            continue
        if record.version not in served:
            export = os.path.join(config.pipeline.root, "serving", model, str(record.version))
            try:
                served[record.version] = ServedWindow(record.version, ServedModel.read(export), wanted)
            except (FileNotFoundError, ValueError, KeyError, tf.errors.OpError) as exc:
                unreadable[record.version] = f"version {record.version}: its export {export} cannot be read ({exc}); " \
                                             "its requests cannot be checked"
                continue
        served[record.version].add(record)
    return served, list(unreadable.values())


def live_threshold_problems(live: LiveMetrics, config: LooplineConfig) -> list[Problem]:
    """`evaluator.thresholds`, the bounds a model was blessed on, applied to the live metrics."""
    problems = []
    for metric, bound in sorted(config.evaluator.thresholds.items()):
        value = live.metrics.get(metric)
        if value is None:
            continue  # no labels for that head in this file: said in the summary's not_joined
        if (bound.min is not None and value < bound.min) or (bound.max is not None and value > bound.max):
            problems.append(Problem("live", metric, "LIVE_METRIC_OUT_OF_BOUNDS",
                                    f"live {metric} {value:.4g} on {live.joined} labelled examples is outside "
                                    f"evaluator.thresholds ({bound.min}, {bound.max})."))
    return problems


def _metric_key(*parts: str) -> str:
    return "/".join(re.sub(r"[^A-Za-z0-9_.\- ]", "_", p) for p in parts)


def version_metrics(check: VersionCheck) -> dict[str, float]:
    metrics = {"monitor/requests": check.requests, "monitor/examples": check.examples,
               "monitor/anomalies": len(check.problems), "monitor/passed": float(check.passed)}
    for kind, measured in check.measures.items():
        metrics.update({_metric_key("monitor", kind, feature): m["value"] for feature, m in measured.items()})
    if check.live is not None:
        metrics.update({_metric_key("monitor", "live", k): v for k, v in check.live.metrics.items()})
        metrics["monitor/live/joined_examples"] = check.live.joined
    return metrics


def record_in_mlflow(config: LooplineConfig, result: MonitorResult) -> list[str]:
    """Each version's figures into the MLflow run that trained it, at the window's end; returns
    notes. A run that cannot be found or written to fails the command (it says so)."""
    from pipeline.tracking_setup import registered_model_name, tracking_target

    target = tracking_target(config)
    if target is None:
        return ["MLflow: not recorded (mlflow.enabled is false)"]
    from tracking.served_runs import eval_metrics, log_metrics_at, run_of_serving_version
    from tracking.target import make_client

    notes = []
    client = make_client(target)
    for check in result.checks:
        try:
            run_id, registered = run_of_serving_version(client, registered_model_name(config), check.version)
            if run_id is None:
                result.failures.append(f"version {check.version}: no registered model version carries "
                                       f"loopline.serving_version={check.version}; the figures were not recorded in MLflow")
                continue
            if check.live is not None:
                check.live.eval = eval_metrics(client, run_id)
            log_metrics_at(client, run_id, version_metrics(check), result.window.until)
            client.log_text(run_id, json.dumps(check.summary(result.window, config.serving.model_name), indent=2),
                            f"monitoring/{check.version}/{result.window.name}/summary.json")
            notes.append(f"version {check.version}: recorded in MLflow run {run_id} (registered version {registered})")
        except Exception as exc:  # noqa: BLE001 - the checks stand; not recording them fails the command
            result.failures.append(f"version {check.version}: MLflow at {target.tracking_uri}: {type(exc).__name__}: "
                                   f"{str(exc).splitlines()[0] if str(exc) else ''}")
    return notes


def result_lines(result: MonitorResult, model: str) -> list[str]:
    """The command's report: verdict, what was named and by how much, where the files are."""
    lines = [f"window     {result.window.describe()}"]
    for check in result.checks:
        verdict = "passed" if check.passed else f"FAILED: {', '.join(sorted({p.feature for p in check.problems}))}"
        lines += [f"version    {model} {check.version}: {check.requests} requests, {check.examples} examples: {verdict}",
                  f"baseline   {check.baseline}"]
        lines += [f"  [{p.split}] {p.feature}: {p.description} ({p.kind})" for p in check.problems]
        for kind, measured in check.measures.items():
            shown = ", ".join(f"{f} {m['value']:.3f}/{m['threshold']:g}" for f, m in sorted(measured.items()))
            lines.append(f"{kind:<10} {shown or '-'}")
        if check.live is not None:
            lines.append(live_line(check.live))
        lines += [f"note       {n}" for n in check.notes]
        lines.append(f"report     {os.path.join(check.out_dir, 'index.html')}")
    lines += [f"note       {n}" for n in result.notes]
    lines += [f"FAILED     {f}" for f in result.failures]
    lines.append("monitor    passed" if result.passed else "monitor    FAILED (exit code 1)")
    return lines


def live_line(live: LiveMetrics) -> str:
    eval_of = live.eval
    shown = ", ".join(f"{k} {v:.4g}" + (f" (eval {eval_of[k]:.4g})" if k in eval_of else "")
                      for k, v in sorted(live.metrics.items()) if not k.endswith("_examples"))
    missed = "; ".join(f"{n} {why}" for why, n in live.not_joined.items())
    return f"live       {shown or 'no metric'} on {live.joined} of {live.labelled} labelled rows" + (f" (not joined: {missed})" if missed else "")
