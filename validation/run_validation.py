"""One run's data validation: every split against the run's schema, the eval split against the
train split (skew), and, when there is a baseline, every split against the baseline's split of
the same name (drift).

Problems fall in two groups. Those found against the baseline (its schema's checks, when the
schema is the baseline's; drift) are changes upstream: `validation.accept_changes` or
`loopline data accept` lets them through. Those within the run (a curated schema's checks, the
run's own inferred schema, train/eval skew, an empty split) always stop it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tensorflow_metadata.proto.v0 import anomalies_pb2, schema_pb2, statistics_pb2

from validation.anomalies import DRIFT_KINDS, T, Problem, add_problem, check_drift, format_problems, validate_split
from validation.baseline import Baseline
from validation.config import ValidationConfig
from validation.labels import UNSEEN_LABEL_SHORT, LabelClasses, unseen_label_classes

TRAIN = "train"  # the split the schema is inferred from and the others are compared with
SCHEMA_SOURCES = ("curated", "baseline", "inferred")


def _no_baseline(schema_source: str) -> str:
    schema = "schema from data.schema" if schema_source == "curated" else "schema inferred from this run"
    return f"no baseline yet (first run on this root): {schema}, drift not checked"


@dataclass
class RunValidation:
    anomalies: dict[str, anomalies_pb2.Anomalies]
    stopping: list[Problem] = field(default_factory=list)
    accepted: list[Problem] = field(default_factory=list)  # against the baseline, let through
    warnings: list[Problem] = field(default_factory=list)  # reported, not stopping (unseen label classes)
    baseline: str = ""  # which baseline was used, in words
    baseline_location: str = ""  # its folder ("" for none)
    accepted_changes: str = ""  # what was accepted, in words ("" when nothing was)

    def report(self) -> str:
        """The text that stops the run (empty when nothing does)."""
        if not self.stopping:
            return ""
        lines = [format_problems(self.stopping), f"({self.baseline})"]
        if any(p.against_baseline for p in self.stopping):
            lines.append("If the change is intended: `loopline data accept` makes this run's data the new baseline, "
                         "or run once with --set validation.accept_changes=true.")
        return "\n".join(lines)

    def warnings_report(self) -> str:
        """One line per warning ("" when there is none)."""
        return "\n".join(f"[{p.split}] {p.feature}: {p.description} ({p.kind})" for p in self.warnings)


def _against_baseline(problem: Problem, schema_source: str) -> bool:
    if problem.against_baseline:  # drift, or a check against the baseline's own schema
        return True
    if problem.feature == "(dataset)" or problem.kind in DRIFT_KINDS:
        return False  # an empty split, train/eval skew: problems within the run
    return schema_source == "baseline"


def validate_run(
    stats: dict[str, statistics_pb2.DatasetFeatureStatistics],
    schema: schema_pb2.Schema,
    schema_source: str,
    baseline: Baseline | None,
    config: ValidationConfig,
    labels: list[LabelClasses] = (),
) -> RunValidation:
    """`schema_source` says where `schema` came from: "curated" (data.schema), "baseline", or
    "inferred" from this run (the first run, or changes being accepted). `labels`: the
    classification labels' classes per split, checked for classes the train split lacks."""
    if schema_source not in SCHEMA_SOURCES:
        raise ValueError(f"schema source {schema_source!r}: expected one of {SCHEMA_SOURCES}")
    result = RunValidation({}, baseline=_no_baseline(schema_source))
    if baseline is not None:
        result.baseline, result.baseline_location = baseline.describe(), baseline.location
    found: list[Problem] = []
    train = stats.get(TRAIN)
    for split, split_stats in stats.items():
        # Guessing "numbers with some text" from value shares is for a schema with nothing before it;
        # a baseline decides a column's type (a numeric one takes no text at all).
        anomalies, problems = validate_split(split, split_stats, schema, config, None if split == TRAIN else train,
                                             guess_numeric_text=baseline is None and schema_source != "baseline")
        found += problems
        if baseline is not None:
            found += _check_against(split, split_stats, schema, schema_source, baseline, config, anomalies)
        result.anomalies[split] = anomalies
    for problem in found:
        problem.against_baseline = _against_baseline(problem, schema_source)
    if config.accept_changes:
        result.accepted = [p for p in found if p.against_baseline]
        result.stopping = [p for p in found if not p.against_baseline]
    else:
        result.stopping = found
    _check_label_classes(result, labels, config)
    if result.accepted:
        result.accepted_changes = "validation.accept_changes: " + "; ".join(
            f"[{p.split}] {p.feature}: {p.kind}" for p in result.accepted)
    elif baseline is not None and baseline.accepted:
        result.accepted_changes = f"loopline data accept: {baseline.accepted}"
    return result


def _check_label_classes(result: RunValidation, labels: list[LabelClasses], config: ValidationConfig) -> None:
    """Eval classes the train split lacks: a warning, or (validation.unseen_label_classes=stop) a
    problem within the run, which acceptance never lets through."""
    stop = config.unseen_label_classes == "stop"
    for label in labels:
        for split, anomalies in result.anomalies.items():
            problem = None if split == TRAIN else unseen_label_classes(label, split, TRAIN, config.example_values)
            if problem is None:
                continue
            add_problem(anomalies, problem, UNSEEN_LABEL_SHORT, T.ERROR if stop else T.WARNING)
            (result.stopping if stop else result.warnings).append(problem)


def _check_against(split, split_stats, schema, schema_source, baseline: Baseline, config, anomalies) -> list[Problem]:
    """Drift against the baseline's split, and (when this run's schema is its own) what the baseline
    schema would have said, so an accepted change is on record."""
    found = []
    if schema_source == "inferred":
        _, changed = validate_split(split, split_stats, baseline.schema, config, guess_numeric_text=False)
        for problem in changed:
            problem.against_baseline = True
            add_problem(anomalies, problem, "Changed against the baseline schema")
        found += changed
    previous = baseline.statistics.get(split)
    if previous is None:
        problem = Problem(split, "(dataset)", "COMPARATOR_CONTROL_DATA_MISSING",
                          f"the baseline has no '{split}' split (it has {sorted(baseline.statistics)}): drift not checked.")
        problem.against_baseline = True
        return found + [problem]
    drift_schema = baseline.schema if schema_source == "inferred" else schema
    drifted = check_drift(split, split_stats, previous, drift_schema, config, anomalies)
    for problem in drifted:
        problem.against_baseline = True
    return found + drifted
