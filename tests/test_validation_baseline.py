"""Checks across runs without a pipeline: the drift math against hand-computed values, TFDV's
record of drift, the baseline files (atomic, remote-safe, fail closed) and which problems an
accepted change lets through."""
import json

import pytest
import tensorflow as tf
from tensorflow_metadata.proto.v0 import anomalies_pb2, statistics_pb2

from test_validation import rows, stats_of
from validation.anomalies import check_drift, js_divergence, linf_distance
from validation.baseline import BaselineError, cache_key, read_baseline, read_baseline_folder, write_baseline
from validation.config import ValidationConfig
from validation.run_validation import validate_run
from validation.schema import infer_schema, schema_changes, schema_text_diff

FNS = statistics_pb2.FeatureNameStatistics


def numeric(buckets):
    """A numeric feature whose STANDARD histogram has the given (low, high, count) buckets."""
    feature = FNS(name="x", type=FNS.FLOAT)
    histogram = feature.num_stats.histograms.add(type=statistics_pb2.Histogram.STANDARD)
    for low, high, count in buckets:
        histogram.buckets.add(low_value=low, high_value=high, sample_count=count)
    return feature


def categorical(counts):
    feature = FNS(name="c", type=FNS.STRING)
    for label, count in counts.items():
        feature.string_stats.rank_histogram.buckets.add(label=label, sample_count=count)
    return feature


def test_jensen_shannon_divergence_matches_the_hand_computed_value():
    # P = (.5, .5), Q = (1, 0), M = (.75, .25):
    # KL(P||M) = .5 log2(.5/.75) + .5 log2(.5/.25) = 0.2075187, KL(Q||M) = log2(1/.75) = 0.4150375,
    # JSD = (0.2075187 + 0.4150375) / 2 = 0.3112781.
    p = numeric([(0, 1, 2), (1, 2, 2)])
    q = numeric([(0, 1, 4), (1, 2, 0)])
    assert js_divergence(p, q) == pytest.approx(0.3112781, abs=1e-6)
    # One wide bucket is spread uniformly over the other's boundaries (TFDV's rebucketing): same P.
    assert js_divergence(numeric([(0, 2, 4)]), q) == pytest.approx(0.3112781, abs=1e-6)
    assert js_divergence(p, p) == pytest.approx(0.0, abs=1e-12)
    # Disjoint supports: the maximum, 1 (base 2).
    assert js_divergence(numeric([(0, 1, 5)]), numeric([(5, 6, 5)])) == pytest.approx(1.0)


def test_l_infinity_distance_matches_the_hand_computed_value():
    # Shares a .6 -> .3, b .4 -> .3, c 0 -> .4: the largest gap is .4, at 'c'.
    gap, value = linf_distance(categorical({"a": 6, "b": 4}), categorical({"a": 3, "b": 3, "c": 4}))
    assert gap == pytest.approx(0.4) and value == "c"


def test_drift_is_recorded_as_tfdv_records_it(tmp_path):
    config = ValidationConfig()
    before = stats_of(tmp_path, "train", rows(300, seed=1))
    after = stats_of(tmp_path, "after", rows(300, seed=2, shift=8.0, colors=("red",) * 3 + ("green",)))
    schema = infer_schema(before, config)
    anomalies = anomalies_pb2.Anomalies()
    problems = check_drift("train", after, before, schema, config, anomalies)
    measured = {info.path.step[0]: info.drift_measurements[0] for info in anomalies.drift_skew_info}
    # Every compared feature has a measurement (as TFDV), anomalies only above the threshold.
    assert set(measured) == {"size", "count", "color"}
    assert measured["size"].type == anomalies_pb2.DriftSkewInfo.Measurement.JENSEN_SHANNON_DIVERGENCE
    assert measured["size"].value > 0.25 and measured["size"].threshold == 0.25
    assert measured["color"].type == anomalies_pb2.DriftSkewInfo.Measurement.L_INFTY
    assert measured["color"].value == pytest.approx(0.75 - 1 / 3, abs=0.01)
    assert measured["count"].value < 0.25
    kinds = {(p.feature, p.kind) for p in problems}
    assert kinds == {("size", "COMPARATOR_JENSEN_SHANNON_DIVERGENCE_HIGH"), ("color", "COMPARATOR_L_INFTY_HIGH")}
    assert "'red'" in next(p.description for p in problems if p.feature == "color")
    # A schema's drift_comparator sets a feature's own threshold; the config keys the others.
    next(f for f in schema.feature if f.name == "color").drift_comparator.infinity_norm.threshold = 0.5
    problems = check_drift("train", after, before, schema, ValidationConfig(max_js_drift=1.0), anomalies_pb2.Anomalies())
    assert problems == []


def test_baseline_files_replace_atomically_and_fail_closed(tmp_path):
    config = ValidationConfig()
    stats = {"train": stats_of(tmp_path, "train", rows(50)), "eval": stats_of(tmp_path, "eval", rows(20, seed=1))}
    schema = infer_schema(stats["train"], config)
    directory = str(tmp_path / "baseline" / "m")
    assert read_baseline(directory) is None and cache_key(directory) == ""
    first = write_baseline(directory, schema, stats, {"pushed_version": "1"})
    second = write_baseline(directory, schema, {"train": stats["train"]}, {"pushed_version": "2"})
    current = read_baseline(directory)
    assert current.location == second and set(current.statistics) == {"train"}
    assert current.statistics["train"] == stats["train"] and current.schema == schema
    assert "pushed version 2" in current.describe()
    # The cache key changes with an acceptance only, and a push keeps the one it replaces.
    assert cache_key(directory) == ""
    accepted = write_baseline(directory, schema, stats, {"statistics": "s"}, accepted="run r: [train] x: SCHEMA_NEW_COLUMN")
    assert cache_key(directory) == accepted.rsplit("/", 1)[1] == read_baseline(directory).acceptance
    write_baseline(directory, schema, stats, {"pushed_version": "3"}, acceptance=read_baseline(directory).acceptance)
    assert cache_key(directory) == accepted.rsplit("/", 1)[1]
    second = write_baseline(directory, schema, {"train": stats["train"]}, {"pushed_version": "2"})
    assert set(read_baseline_folder(first).statistics) == {"train", "eval"}  # older ones stay readable
    assert not [p for p in (tmp_path / "baseline" / "m").iterdir() if ".tmp-" in p.name]
    # A record naming a missing file, or a broken record: an error naming the file, never "no baseline".
    (tmp_path / "baseline" / "m" / second.rsplit("/", 1)[1] / "Split-train" / "FeatureStats.pb").write_bytes(b"junk")
    with pytest.raises(BaselineError, match=r"Split-train/FeatureStats.pb"):
        read_baseline(directory)
    (tmp_path / "baseline" / "m" / "CURRENT.json").write_text("{not json")
    with pytest.raises(BaselineError, match=r"CURRENT.json cannot be read"):
        read_baseline(directory)


def test_baseline_on_a_remote_filesystem():
    """Only tf.io.gfile touches the files: TensorFlow's in-memory ram:// filesystem stands in
    for gs://."""
    stats = statistics_pb2.DatasetFeatureStatistics(name="train", num_examples=1)
    stats.features.add(name="x", type=FNS.INT)
    schema = infer_schema(stats, ValidationConfig())
    directory = "ram://loopline-test/baseline/m"
    write_baseline(directory, schema, {"train": stats}, {"pushed_version": "7"})
    assert read_baseline(directory).statistics["train"] == stats
    assert json.loads(tf.io.gfile.GFile(f"{directory}/CURRENT.json").read())["source"]["pushed_version"] == "7"


def _baseline(tmp_path, data):
    config = ValidationConfig()
    stats = {"train": stats_of(tmp_path, "base", data)}
    write_baseline(str(tmp_path / "b"), infer_schema(stats["train"], config), stats, {"pushed_version": "1"})
    return read_baseline(str(tmp_path / "b"))


def test_changes_against_the_baseline_stop_unless_accepted(tmp_path):
    baseline = _baseline(tmp_path, rows(300))
    changed = rows(300, seed=3, shift=8.0)
    for row in changed:
        del row["count"]  # a dropped column
    stats = {"train": stats_of(tmp_path, "new", changed)}
    result = validate_run(stats, baseline.schema, "baseline", baseline, ValidationConfig())
    found = {(p.feature, p.kind) for p in result.stopping}
    assert found == {("count", "SCHEMA_MISSING_COLUMN"), ("size", "COMPARATOR_JENSEN_SHANNON_DIVERGENCE_HIGH")}
    assert "loopline data accept" in result.report() and "pushed version 1" in result.report()
    # Accepted: the run's own schema is inferred; the changes are let through and on record.
    accept = ValidationConfig(accept_changes=True)
    own = infer_schema(stats["train"], accept)
    result = validate_run(stats, own, "inferred", baseline, accept)
    assert result.stopping == []
    assert {(p.feature, p.kind) for p in result.accepted} == found
    assert "SCHEMA_MISSING_COLUMN" in result.accepted_changes
    assert "count" in result.anomalies["train"].anomaly_info  # still written to SchemaDiff.pb


def test_accepting_never_lets_through_problems_within_the_run(tmp_path):
    baseline = _baseline(tmp_path, rows(300))
    accept = ValidationConfig(accept_changes=True)
    stats = {"train": stats_of(tmp_path, "t", rows(300, seed=1)), "eval": stats_of(tmp_path, "e", rows(150, seed=2, shift=8.0))}
    result = validate_run(stats, infer_schema(stats["train"], accept), "inferred", baseline, accept)
    # eval against train (skew) stops; eval against the baseline's eval: the baseline has none.
    assert ("size", "COMPARATOR_JENSEN_SHANNON_DIVERGENCE_HIGH") in {(p.feature, p.kind) for p in result.stopping}
    assert all(p.split == "eval" for p in result.stopping)
    assert "COMPARATOR_CONTROL_DATA_MISSING" in {p.kind for p in result.accepted}


def test_a_minority_of_text_in_a_baseline_numeric_column_stops(tmp_path):
    baseline = _baseline(tmp_path, rows(300))
    data = rows(300, seed=4)
    for i, row in enumerate(data):  # one value in seven becomes text: below numeric_text_fraction
        row["size"] = ("n/a" if i % 14 == 0 else "unknown") if i % 7 == 0 else f"{row['size']:.2f}"
    stats = {"train": stats_of(tmp_path, "text", data)}
    assert validate_run(stats, infer_schema(stats["train"], ValidationConfig()), "inferred", None,
                        ValidationConfig()).stopping == []  # what the first run alone would see
    result = validate_run(stats, baseline.schema, "baseline", baseline, ValidationConfig())
    problem = next(p for p in result.stopping if p.feature == "size")
    assert problem.kind == "FLOAT_TYPE_STRING_NOT_FLOAT" and "'n/a'" in problem.description and "'unknown'" in problem.description
    assert "pushed version 1" in result.baseline


def test_schema_changes_in_words(tmp_path):
    config = ValidationConfig()
    old = infer_schema(stats_of(tmp_path, "a", rows(100)), config)
    changed = rows(100, colors=("red", "green", "blue", "teal"))
    for row in changed:
        del row["count"]
        row["size"] = str(row["size"])
    lines = schema_changes(old, infer_schema(stats_of(tmp_path, "b", changed), config))
    assert "- count (INT): no longer in the data" in lines
    assert any(line.startswith("~ size: type FLOAT -> BYTES") for line in lines)
    assert any(line.startswith("~ color: domain") and "'teal'" in line for line in lines)
    # The diff to apply to a curated file by hand: unified, naming both sides.
    diff = schema_text_diff(old, infer_schema(stats_of(tmp_path, "b", changed), config), "curated.pbtxt", "new")
    assert diff.startswith("--- curated.pbtxt\n+++ new\n") and '+  value: "teal"' in diff


def test_a_baseline_text_column_is_not_second_guessed(tmp_path):
    """Once a baseline says a column is text (an accepted change), a split whose share of numbers
    happens to reach validation.numeric_text_fraction is not reported as a broken numeric column."""
    def texts(n, every):
        data = rows(n, seed=every)
        for i, row in enumerate(data):
            row["size"] = "n/a" if i % every == 0 else f"{row['size']:.2f}"
        return data

    config = ValidationConfig()
    base = {"train": stats_of(tmp_path, "base", texts(300, 7))}  # 86% numbers: inferred as text
    write_baseline(str(tmp_path / "b"), infer_schema(base["train"], config), base, {"pushed_version": "1"})
    baseline = read_baseline(str(tmp_path / "b"))
    stats = {"train": stats_of(tmp_path, "new", texts(300, 11))}  # 91% numbers
    assert validate_run(stats, baseline.schema, "baseline", baseline, config).stopping == []
    assert validate_run(stats, infer_schema(stats["train"], config), "inferred", None, config).stopping != []
