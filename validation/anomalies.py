"""Checks split statistics against a Schema and against each other; the result is one
tensorflow-metadata `Anomalies` per split, stored as TFDV stores it (`Split-<name>/SchemaDiff.pb`).

Checks: features missing from or unexpected by the schema, type mismatches (including a numeric
column holding some text, which CSV reading turns into a string column), values outside a string
domain or a numeric range, missing rate over the schema's presence, and train/eval skew:
L-infinity distance of category frequencies, Jensen-Shannon divergence of numeric histograms.
Each anomaly's description names a few offending values so a report is readable on its own.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import tensorflow as tf
from tensorflow_metadata.proto.v0 import anomalies_pb2, schema_pb2, statistics_pb2

from validation.config import ValidationConfig
from validation.schema import SCHEMA_TYPES, is_number_text, numeric_fraction, string_domain
from validation.statistics import common_stats, value_counts

ANOMALIES_FILE = "SchemaDiff.pb"  # tfx.components.example_validator.executor.DEFAULT_FILE_NAME
T = anomalies_pb2.AnomalyInfo
FNS = statistics_pb2.FeatureNameStatistics
_TYPE_NAMES = {schema_pb2.INT: "INT", schema_pb2.FLOAT: "FLOAT", schema_pb2.BYTES: "BYTES"}


class DataAnomaliesError(ValueError):
    """Raised to stop a pipeline when the data has anomalies; the message is the report."""


@dataclass
class Problem:
    split: str
    feature: str
    kind: str  # the AnomalyInfo.Type name
    description: str
    against_baseline: bool = False  # found against the baseline (an upstream change), not within the run


def _quote(values, limit: int) -> str:
    shown = [repr(v) for v in list(values)[:limit]]
    more = len(values) - len(shown)
    return ", ".join(shown) + (f" (+{more} more)" if more > 0 else "")


def _numbers_from_histogram(feature: statistics_pb2.FeatureNameStatistics) -> np.ndarray:
    for histogram in feature.num_stats.histograms:
        if histogram.type == statistics_pb2.Histogram.STANDARD:
            return histogram
    return None


def _split_buckets(histogram) -> tuple[list, dict[float, float], float]:
    """TFDV's StripPointAndInfiniteBuckets: ranged buckets, point masses, mass at infinite bounds."""
    ranged, points, infinite = [], {}, 0.0
    for bucket in histogram.buckets:
        low, high, count = bucket.low_value, bucket.high_value, bucket.sample_count
        if not (math.isfinite(low) and math.isfinite(high)):
            infinite += count
        elif low == high:
            points[low] = points.get(low, 0.0) + count
        else:
            ranged.append((low, high, count))
    return ranged, points, infinite


def _rebin(ranged: list, edges: np.ndarray) -> np.ndarray:
    """Spreads each bucket's count uniformly over the common `edges` (TFDV's RebucketHistogram)."""
    out = np.zeros(max(len(edges) - 1, 0))
    for low, high, count in ranged:
        overlap = np.clip(np.minimum(edges[1:], high) - np.maximum(edges[:-1], low), 0.0, None)
        out += count * overlap / (high - low)
    return out


def aligned_histograms(ha, hb) -> tuple[np.ndarray, np.ndarray]:
    """Two histograms as counts over the same buckets, as TFDV's AlignHistograms builds them: the
    union of their bucket boundaries (counts spread uniformly within a bucket), then one bucket per
    point mass, one per side for values at infinite bounds and, when either has NaNs, two for NaN."""
    ranged_a, points_a, inf_a = _split_buckets(ha)
    ranged_b, points_b, inf_b = _split_buckets(hb)
    edges = np.asarray(sorted({x for low, high, _ in ranged_a + ranged_b for x in (low, high)}))
    p, q = list(_rebin(ranged_a, edges)), list(_rebin(ranged_b, edges))
    for point in sorted(set(points_a) | set(points_b)):
        p.append(points_a.get(point, 0.0))
        q.append(points_b.get(point, 0.0))
    if inf_a:
        p, q = p + [inf_a], q + [0.0]
    if inf_b:
        p, q = p + [0.0], q + [inf_b]
    if ha.num_nan > 0 or hb.num_nan > 0:
        p, q = p + [0.0, ha.num_nan], q + [hb.num_nan, 0.0]
    return np.asarray(p, np.float64), np.asarray(q, np.float64)


def js_divergence(a: statistics_pb2.FeatureNameStatistics, b: statistics_pb2.FeatureNameStatistics) -> float:
    """TFDV's approximate Jensen-Shannon divergence of two numeric features' STANDARD histograms:
    (KL(P||M) + KL(Q||M)) / 2 with M = (P + Q) / 2, logarithms in base 2, capped at 1."""
    ha, hb = _numbers_from_histogram(a), _numbers_from_histogram(b)
    if ha is None or hb is None or not ha.buckets or not hb.buckets:
        return 0.0
    p, q = aligned_histograms(ha, hb)
    if p.sum() == 0 or q.sum() == 0:
        return 0.0
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2

    def kl(x: np.ndarray) -> float:
        both = (x > 0) & (m > 0)
        return float(np.sum(x[both] * np.log2(x[both] / m[both])))

    return min((kl(p) + kl(q)) / 2, 1.0)


def linf_distance(a: statistics_pb2.FeatureNameStatistics, b: statistics_pb2.FeatureNameStatistics) -> tuple[float, str]:
    """L-infinity distance between two string features' value frequencies, and the value at it."""
    ca, cb = value_counts(a), value_counts(b)
    ta, tb = sum(ca.values()), sum(cb.values())
    if not ta or not tb:
        return 0.0, ""
    gaps = {v: abs(ca.get(v, 0.0) / ta - cb.get(v, 0.0) / tb) for v in set(ca) | set(cb)}
    worst = max(gaps, key=lambda v: (gaps[v], v))
    return gaps[worst], worst


class _Collector:
    def __init__(self, split: str, anomalies: anomalies_pb2.Anomalies | None = None):
        self.split = split
        self.anomalies = anomalies if anomalies is not None else anomalies_pb2.Anomalies(
            anomaly_name_format=anomalies_pb2.Anomalies.SERIALIZED_PATH)
        self.problems: list[Problem] = []

    def add(self, feature: str, kind: int, short: str, description: str, severity: int = T.ERROR) -> None:
        info = self.anomalies.anomaly_info[feature]
        if not info.path.step:
            info.path.step.append(feature)
        info.severity = max(info.severity, severity)  # ERROR over WARNING, as TFDV merges a feature's reasons
        info.reason.add(type=kind, short_description=short, description=description)
        info.short_description = short if len(info.reason) == 1 else "Multiple errors"
        info.description = " ".join(r.description for r in info.reason)
        self.problems.append(Problem(self.split, feature, T.Type.Name(kind), description))


def _check_feature(out: _Collector, schema, feature, stats, num_examples, config: ValidationConfig,
                   guess_numeric_text: bool = True) -> None:
    if _check_type(out, feature, stats, config):
        return
    common = common_stats(stats)
    _check_counts(out, feature, common, num_examples)
    if feature.HasField("image_domain"):
        return  # encoded images: no string domain
    actual = SCHEMA_TYPES.get(stats.type)
    if actual == schema_pb2.BYTES:
        _check_strings(out, schema, feature, stats, config, guess_numeric_text)
    elif actual in (schema_pb2.INT, schema_pb2.FLOAT) and common.num_non_missing:
        _check_range(out, feature, stats)


def _check_type(out: _Collector, feature, stats, config: ValidationConfig) -> bool:
    """Reports a type other than the schema's; True when it did (the other checks then do not apply)."""
    name, limit, expected = feature.name, config.example_values, feature.type
    actual = SCHEMA_TYPES.get(stats.type)
    if not common_stats(stats).num_non_missing or actual == expected or feature.type not in _TYPE_NAMES:
        return False
    if expected in (schema_pb2.INT, schema_pb2.FLOAT) and actual == schema_pb2.BYTES:
        bad = [v for v in value_counts(stats) if not is_number_text(v)] or list(value_counts(stats))
        kind = T.FLOAT_TYPE_STRING_NOT_FLOAT if expected == schema_pb2.FLOAT else T.INT_TYPE_NOT_INT_STRING
        out.add(name, kind, "Text in a numeric column",
                f"'{name}' should hold {_TYPE_NAMES[expected]} numbers but holds text, e.g. {_quote(bad, limit)}.")
    else:
        out.add(name, T.UNEXPECTED_DATA_TYPE, "Unexpected data type",
                f"'{name}' should hold {_TYPE_NAMES[expected]} values but holds {_TYPE_NAMES.get(actual, '?')}.")
    return True


def _check_counts(out: _Collector, feature, common, num_examples: int) -> None:
    """Presence (the missing rate), and values per example beyond the schema's value_count.max or
    shape (the trainer would refuse them)."""
    name, present = feature.name, common.num_non_missing
    fraction = present / num_examples if num_examples else 0.0
    if feature.presence.min_fraction and fraction < feature.presence.min_fraction:
        out.add(name, T.FEATURE_TYPE_LOW_FRACTION_PRESENT, "Column dropped or mostly missing",
                f"'{name}' is missing in {1 - fraction:.0%} of {num_examples} examples "
                f"(at most {1 - feature.presence.min_fraction:.0%} allowed).")
    elif feature.presence.min_count and present < feature.presence.min_count:
        out.add(name, T.FEATURE_TYPE_LOW_NUMBER_PRESENT, "Too few values",
                f"'{name}' has {present} values (at least {feature.presence.min_count} expected).")
    allowed = int(np.prod([d.size for d in feature.shape.dim])) if feature.HasField("shape") else \
        feature.value_count.max if feature.HasField("value_count") and feature.value_count.max else None
    if allowed is not None and present and common.max_num_values > allowed:
        out.add(name, T.FEATURE_TYPE_HIGH_NUMBER_VALUES, "Too many values per example",
                f"'{name}' has examples with {common.max_num_values} values; the schema allows {allowed}.")


def _check_strings(out: _Collector, schema, feature, stats, config: ValidationConfig, guess_numeric_text: bool) -> None:
    """Values outside the string domain; or, without one, a column of numbers holding some text."""
    name, limit = feature.name, config.example_values
    counts = value_counts(stats)
    allowed = string_domain(schema, feature)
    if allowed is not None:
        in_domain = set(allowed)
        unseen = sorted((v for v in counts if v not in in_domain), key=lambda v: -counts[v])
        total = sum(counts.values())
        mass = 1.0 - sum(counts[v] for v in unseen) / total if total else 1.0
        needed = feature.distribution_constraints.min_domain_mass if feature.HasField("distribution_constraints") else 1.0
        if unseen and mass < needed:
            out.add(name, T.ENUM_TYPE_UNEXPECTED_STRING_VALUES, "Unexpected string values",
                    f"'{name}' has values outside its domain: {_quote(unseen, limit)} "
                    f"({1 - mass:.1%} of values; domain: {_quote(allowed, limit)}).")
    elif guess_numeric_text and feature.type == schema_pb2.BYTES and \
            config.numeric_text_fraction <= (numbers := numeric_fraction(stats)) < 1.0:
        bad = sorted((v for v in counts if not is_number_text(v)), key=lambda v: -counts[v])
        out.add(name, T.FLOAT_TYPE_STRING_NOT_FLOAT, "Text in a numeric column",
                f"'{name}' is a numeric column ({numbers:.0%} of values are numbers) "
                f"holding text, e.g. {_quote(bad, limit)}.")


def _check_range(out: _Collector, feature, stats) -> None:
    """Values outside the schema's int_domain / float_domain, and infinities it disallows."""
    name, expected = feature.name, feature.type
    domain = feature.int_domain if feature.HasField("int_domain") else feature.float_domain if feature.HasField("float_domain") else None
    if domain is None:
        return
    low, high = stats.num_stats.min, stats.num_stats.max
    if domain.HasField("min") and low < domain.min:
        kind = T.INT_TYPE_SMALL_INT if expected == schema_pb2.INT else T.FLOAT_TYPE_SMALL_FLOAT
        out.add(name, kind, "Out-of-range values",
                f"'{name}' has values down to {low:g}, below the minimum {domain.min:g}.")
    if domain.HasField("max") and high > domain.max:
        kind = T.INT_TYPE_BIG_INT if expected == schema_pb2.INT else T.FLOAT_TYPE_BIG_FLOAT
        out.add(name, kind, "Out-of-range values",
                f"'{name}' has values up to {high:g}, above the maximum {domain.max:g}.")
    if feature.float_domain.disallow_inf and (math.isinf(low) or math.isinf(high)):
        out.add(name, T.FLOAT_TYPE_HAS_INF, "Infinite values",
                f"'{name}' has infinite values ({low:g} to {high:g}); the schema's float_domain disallows "
                f"them (set disallow_inf: false to let the trainer read them as missing).")


def _check_skew(out: _Collector, feature, stats, baseline, baseline_name: str, config: ValidationConfig) -> None:
    """Train/eval skew: the measure and threshold of _skew_of, in this check's own words."""
    measured = _skew_of(feature, stats, baseline, config)
    if measured is None or measured[1] <= measured[2]:
        return
    kind, value, threshold, _ = measured
    name = feature.name
    if kind == M.L_INFTY:
        out.add(name, T.COMPARATOR_L_INFTY_HIGH, "High L-infinity distance between splits",
                f"'{name}' category frequencies differ from '{baseline_name}': L-infinity distance {value:.3f} "
                f"> {threshold:g} (largest change: {linf_distance(baseline, stats)[1]!r}).")
    else:
        out.add(name, T.COMPARATOR_JENSEN_SHANNON_DIVERGENCE_HIGH, "High Jensen-Shannon divergence between splits",
                f"'{name}' distribution differs from '{baseline_name}': Jensen-Shannon divergence {value:.3f} "
                f"> {threshold:g} (mean {baseline.num_stats.mean:.4g} -> {stats.num_stats.mean:.4g}).")


M = anomalies_pb2.DriftSkewInfo.Measurement
DRIFT_KINDS = ("COMPARATOR_L_INFTY_HIGH", "COMPARATOR_JENSEN_SHANNON_DIVERGENCE_HIGH")


def _share(counts: dict[str, float], value: str) -> float:
    total = sum(counts.values())
    return counts.get(value, 0.0) / total if total else 0.0


def _measure(comparator, stats, baseline, max_linf: float, max_js: float):
    """(measurement type, value, threshold, words) of one feature against another distribution of
    it (`comparator`: the schema's skew or drift comparator, else the thresholds given), or None
    when the two are not comparable (their types differ: that is a schema anomaly)."""
    if stats.type == FNS.STRING and baseline.type == FNS.STRING:
        threshold = comparator.infinity_norm.threshold if comparator.HasField("infinity_norm") else max_linf
        gap, value = linf_distance(baseline, stats)
        shares = f"{_share(value_counts(baseline), value):.1%} -> {_share(value_counts(stats), value):.1%}"
        return M.L_INFTY, gap, threshold, f"L-infinity distance {gap:.3f} > {threshold:g} (largest change: {value!r}, {shares} of values)"
    if stats.type in (FNS.INT, FNS.FLOAT) and baseline.type in (FNS.INT, FNS.FLOAT):
        has = comparator.HasField("jensen_shannon_divergence")
        threshold = comparator.jensen_shannon_divergence.threshold if has else max_js
        divergence = js_divergence(baseline, stats)
        a, b = baseline.num_stats, stats.num_stats
        return (M.JENSEN_SHANNON_DIVERGENCE, divergence, threshold,
                f"Jensen-Shannon divergence {divergence:.3f} > {threshold:g} (mean {a.mean:.4g} -> {b.mean:.4g}; "
                f"range {a.min:.4g}..{a.max:.4g} -> {b.min:.4g}..{b.max:.4g})")
    return None


def _drift_of(feature, stats, baseline, config: ValidationConfig):
    return _measure(feature.drift_comparator, stats, baseline, config.max_linf_drift, config.max_js_drift)


def _skew_of(feature, stats, baseline, config: ValidationConfig):
    return _measure(feature.skew_comparator, stats, baseline, config.max_linf_distance, config.max_js_divergence)


def _compare(split, stats, baseline, schema, config, anomalies, skew: bool, against: str) -> list[Problem]:
    """Every schema feature of `stats` measured against `baseline`, recorded in `anomalies` as TFDV
    records it (a `drift_skew_info` per feature: `skew_measurements` or `drift_measurements`),
    with a COMPARATOR_* anomaly where the value is above the threshold."""
    out = _Collector(split, anomalies)
    by_name = {f.name: f for f in stats.features}
    base_by_name = {f.name: f for f in baseline.features}
    for feature in schema.feature:
        current, previous = by_name.get(feature.name), base_by_name.get(feature.name)
        if current is None or previous is None or not common_stats(current).num_non_missing:
            continue  # a dropped column is the schema check's to report
        measured = (_skew_of if skew else _drift_of)(feature, current, previous, config)
        if measured is None:
            continue
        kind, value, threshold, words = measured
        info = anomalies.drift_skew_info.add()
        info.path.step.append(feature.name)
        (info.skew_measurements if skew else info.drift_measurements).add(type=kind, value=value, threshold=threshold)
        if value > threshold:
            anomaly = T.COMPARATOR_L_INFTY_HIGH if kind == M.L_INFTY else T.COMPARATOR_JENSEN_SHANNON_DIVERGENCE_HIGH
            name = "L-infinity distance" if kind == M.L_INFTY else "approximate Jensen-Shannon divergence"
            if skew:
                out.add(feature.name, anomaly, f"High {name} between training and serving",
                        f"'{feature.name}' in '{split}' is skewed from {against}: {words}.")
            else:
                out.add(feature.name, anomaly, f"High {name} between current and previous",
                        f"'{feature.name}' drifted from {against}: {words}.")
    return out.problems


def check_drift(
    split: str,
    stats: statistics_pb2.DatasetFeatureStatistics,
    baseline: statistics_pb2.DatasetFeatureStatistics,
    schema: schema_pb2.Schema,
    config: ValidationConfig,
    anomalies: anomalies_pb2.Anomalies,
    against: str | None = None,
) -> list[Problem]:
    """Drift of a split against the baseline's split of the same name (`against`: what the
    baseline is, in words), added to `anomalies` as TFDV records it: a `drift_skew_info`
    measurement for every compared feature, and a COMPARATOR_* anomaly where the value is above
    the threshold (the schema's drift_comparator, else validation.max_linf_drift / max_js_drift)."""
    return _compare(split, stats, baseline, schema, config, anomalies, False, against or f"the baseline's '{split}' split")


def check_skew(
    split: str,
    stats: statistics_pb2.DatasetFeatureStatistics,
    training: statistics_pb2.DatasetFeatureStatistics,
    schema: schema_pb2.Schema,
    config: ValidationConfig,
    anomalies: anomalies_pb2.Anomalies,
    against: str = "the training data",
) -> list[Problem]:
    """Training/serving skew, as TFDV's validate_statistics with serving statistics: served data
    against the training split, a `skew_measurements` entry for every compared feature and a
    COMPARATOR_* anomaly above the threshold (the schema's skew_comparator, else
    validation.max_linf_distance / max_js_divergence, the train/eval skew thresholds)."""
    return _compare(split, stats, training, schema, config, anomalies, True, against)


def validate_split(
    split: str,
    stats: statistics_pb2.DatasetFeatureStatistics,
    schema: schema_pb2.Schema,
    config: ValidationConfig,
    baseline: statistics_pb2.DatasetFeatureStatistics | None = None,
    guess_numeric_text: bool = True,
) -> tuple[anomalies_pb2.Anomalies, list[Problem]]:
    """One split's anomalies against the schema, and its skew against `baseline` (the train split).
    `guess_numeric_text`: report a text column of mostly numbers (validation.numeric_text_fraction)
    as a broken numeric one; off when the schema's BYTES type was decided by a previous run."""
    out = _Collector(split)
    out.anomalies.baseline.CopyFrom(schema)
    by_name = {f.name: f for f in stats.features}
    base_by_name = {f.name: f for f in baseline.features} if baseline is not None else {}
    if stats.num_examples == 0:
        out.anomalies.dataset_anomaly_info.severity = T.ERROR
        out.anomalies.dataset_anomaly_info.description = f"split '{split}' has no examples"
        out.problems.append(Problem(split, "(dataset)", "DATASET_EMPTY", f"split '{split}' has no examples."))
    for feature in schema.feature:
        feature_stats = by_name.get(feature.name)
        if feature_stats is None or common_stats(feature_stats).num_non_missing == 0:
            if feature.presence.min_count or feature.presence.min_fraction:
                out.add(feature.name, T.SCHEMA_MISSING_COLUMN, "Column dropped",
                        f"'{feature.name}' is in the schema but not in the data of split '{split}'.")
            continue
        _check_feature(out, schema, feature, feature_stats, stats.num_examples, config, guess_numeric_text)
        if feature.name in base_by_name and feature.name not in out.anomalies.anomaly_info:
            _check_skew(out, feature, feature_stats, base_by_name[feature.name], baseline.name, config)
    known = {f.name for f in schema.feature}
    for feature_stats in stats.features:
        if feature_stats.name not in known:
            which = feature_stats.WhichOneof("stats")
            examples = list(value_counts(feature_stats))[: config.example_values] if which == "string_stats" else []
            extra = f", e.g. {_quote(examples, config.example_values)}" if examples else ""
            out.add(feature_stats.name, T.SCHEMA_NEW_COLUMN, "New column",
                    f"'{feature_stats.name}' is in the data of split '{split}' but not in the schema{extra}.")
    return out.anomalies, out.problems


def add_problem(anomalies: anomalies_pb2.Anomalies, problem: Problem, short: str, severity: int = T.ERROR) -> None:
    """Adds a problem found by another check (e.g. against another schema) to `anomalies`."""
    if problem.feature != "(dataset)":
        _Collector(problem.split, anomalies).add(problem.feature, T.Type.Value(problem.kind), short, problem.description,
                                                 severity)


def has_anomalies(anomalies: anomalies_pb2.Anomalies) -> bool:
    """TFX's ExampleValidator rule for `blessed`."""
    return bool(anomalies.anomaly_info) or anomalies.HasField("dataset_anomaly_info")


def write_anomalies(split_dir: str, anomalies: anomalies_pb2.Anomalies) -> str:
    tf.io.gfile.makedirs(split_dir)
    path = os.path.join(split_dir, ANOMALIES_FILE)
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(anomalies.SerializeToString())
    return path


def read_anomalies(split_dir: str) -> anomalies_pb2.Anomalies:
    with tf.io.gfile.GFile(os.path.join(split_dir, ANOMALIES_FILE), "rb") as f:
        return anomalies_pb2.Anomalies.FromString(f.read())


def problems_of(split: str, anomalies: anomalies_pb2.Anomalies) -> list[Problem]:
    """The readable problems stored in an Anomalies proto."""
    out = []
    for feature, info in sorted(anomalies.anomaly_info.items()):
        for reason in info.reason:
            out.append(Problem(split, feature, T.Type.Name(reason.type), reason.description))
    if anomalies.HasField("dataset_anomaly_info"):
        out.append(Problem(split, "(dataset)", "DATASET", anomalies.dataset_anomaly_info.description))
    return out


def format_problems(problems: list[Problem]) -> str:
    """One line per problem: split, feature, problem (with example values)."""
    lines = [f"data validation found {len(problems)} anomal{'y' if len(problems) == 1 else 'ies'}:"]
    for p in problems:
        lines.append(f"  [{p.split}] {p.feature}: {p.description} ({p.kind})")
    return "\n".join(lines)
