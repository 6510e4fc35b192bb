"""Statistics, schema and anomaly checks on tf.Examples written in the test (no pipeline)."""
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2, statistics_pb2

from trainer.features import kinds_from_schema
from validation.anomalies import js_divergence, linf_distance, problems_of, read_anomalies, validate_split, write_anomalies
from validation.config import ValidationConfig
from validation.schema import infer_schema, load_schema, write_schema
from validation.statistics import compute_statistics, read_statistics, write_statistics


def feature(value):
    if isinstance(value, str):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
    if isinstance(value, int):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
    return tf.train.Feature(float_list=tf.train.FloatList(value=[value]))


def write_split(path, rows):
    with tf.io.TFRecordWriter(str(path), options="GZIP") as writer:
        for row in rows:
            features = {k: feature(v) for k, v in row.items() if v is not None}
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    return str(path)


def stats_of(tmp_path, name, rows):
    return compute_statistics(write_split(tmp_path / f"{name}.gz", rows), name)


def rows(n, seed=0, shift=0.0, colors=("red", "green", "blue")):
    rng = np.random.default_rng(seed)
    return [{"size": float(rng.normal(10 + shift, 2)), "count": int(rng.integers(0, 5)),
             "color": colors[i % len(colors)]} for i in range(n)]


def test_statistics_per_feature(tmp_path):
    data = rows(200)
    data[3]["size"] = None  # one missing value
    stats = stats_of(tmp_path, "train", data)
    by = {f.name: f for f in stats.features}
    assert stats.num_examples == 200
    size = by["size"].num_stats
    values = np.array([r["size"] for r in data if r["size"] is not None], np.float32)
    assert size.common_stats.num_missing == 1 and size.common_stats.num_non_missing == 199
    assert size.mean == pytest.approx(values.mean(), rel=1e-5)
    assert size.std_dev == pytest.approx(values.std(), rel=1e-4)
    assert (size.min, size.max) == (pytest.approx(values.min()), pytest.approx(values.max()))
    assert size.median == pytest.approx(np.median(values), rel=1e-5)
    kinds = {h.type: h for h in size.histograms}
    assert sum(b.sample_count for b in kinds[statistics_pb2.Histogram.STANDARD].buckets) == 199
    assert len(kinds[statistics_pb2.Histogram.QUANTILES].buckets) == 10
    assert by["count"].type == statistics_pb2.FeatureNameStatistics.INT
    color = by["color"].string_stats
    assert color.unique == 3
    assert {v.value: v.frequency for v in color.top_values} == {"red": 67, "green": 67, "blue": 66}
    # Stored as TFDV stores it, and read back unchanged.
    write_statistics(str(tmp_path / "Split-train"), stats)
    assert (tmp_path / "Split-train" / "FeatureStats.pb").is_file()
    assert read_statistics(str(tmp_path / "Split-train")) == stats


def test_inferred_schema_types_presence_domains_and_trainer_kinds(tmp_path):
    schema = infer_schema(stats_of(tmp_path, "train", rows(100)), ValidationConfig(max_missing_fraction=0.2))
    by = {f.name: f for f in schema.feature}
    assert by["size"].type == schema_pb2.FLOAT and by["count"].type == schema_pb2.INT and by["color"].type == schema_pb2.BYTES
    assert by["size"].presence.min_fraction == pytest.approx(0.8)
    assert by["color"].domain == "color"
    assert sorted(schema.string_domain[0].value) == ["blue", "green", "red"]
    write_schema(str(tmp_path / "schema"), schema)
    assert load_schema(str(tmp_path / "schema")) == schema  # schema.pbtxt, text format
    assert kinds_from_schema(schema) == {"color": "string", "count": "int64", "size": "float32"}


def test_a_column_sparse_in_training_gets_no_presence_floor(tmp_path):
    """A column mostly empty in the train split (75% here, over max_missing_fraction) does not stop
    the run that inferred the schema from that split; a column present enough keeps the floor, and
    a later split where it drops below is still reported."""
    train = rows(200)
    for row in train[:150]:
        row["color"] = None
    schema = infer_schema(stats_of(tmp_path, "train", train), ValidationConfig())
    by = {f.name: f for f in schema.feature}
    assert by["color"].presence.min_fraction == 0 and by["color"].presence.min_count == 1
    assert by["size"].presence.min_fraction == pytest.approx(0.5)
    _, found = check(tmp_path, train, [dict(r) for r in train])
    assert not [k for k in found if k[1] == "FEATURE_TYPE_LOW_FRACTION_PRESENT"]
    thin = rows(100, seed=4)
    for row in thin[:70]:
        row["size"] = None
    _, found = check(tmp_path, train, thin)
    assert "70%" in found[("size", "FEATURE_TYPE_LOW_FRACTION_PRESENT")]


def test_clean_eval_split_has_no_anomalies(tmp_path):
    config = ValidationConfig()
    train = stats_of(tmp_path, "train", rows(300, seed=1))
    schema = infer_schema(train, config)
    anomalies, problems = validate_split("eval", stats_of(tmp_path, "eval", rows(150, seed=2)), schema, config, train)
    assert problems == [] and not anomalies.anomaly_info


def check(tmp_path, train_rows, eval_rows, config=None, schema=None):
    config = config or ValidationConfig()
    train = stats_of(tmp_path, "train", train_rows)
    schema = schema or infer_schema(train, config)
    anomalies, problems = validate_split("eval", stats_of(tmp_path, "eval", eval_rows), schema, config, train)
    return anomalies, {(p.feature, p.kind): p.description for p in problems}


def test_unseen_category_and_new_and_missing_columns(tmp_path):
    bad = rows(90, seed=2, colors=("red", "green", "blue", "purple"))
    for row in bad:
        del row["count"]
        row["extra"] = "x"
    anomalies, found = check(tmp_path, rows(300), bad)
    assert "'purple'" in found[("color", "ENUM_TYPE_UNEXPECTED_STRING_VALUES")]
    assert ("count", "SCHEMA_MISSING_COLUMN") in found
    assert ("extra", "SCHEMA_NEW_COLUMN") in found
    # Stored as TFDV's SchemaDiff.pb and read back to the same problems.
    write_anomalies(str(tmp_path / "Split-eval"), anomalies)
    assert {(p.feature, p.kind) for p in problems_of("eval", read_anomalies(str(tmp_path / "Split-eval")))} == set(found)


def test_text_in_numeric_column_against_inferred_and_curated_schemas(tmp_path):
    train = rows(300)
    for i, row in enumerate(train):
        row["size"] = "oops" if i == 5 else f"{row['size']:.2f}"  # what CSV reading makes of it
    _, found = check(tmp_path, train, [dict(r) for r in train[:100]])
    assert "'oops'" in found[("size", "FLOAT_TYPE_STRING_NOT_FLOAT")]
    curated = text_format.Parse('feature { name: "size" type: FLOAT } feature { name: "count" type: INT } '
                                'feature { name: "color" type: BYTES }', schema_pb2.Schema())
    _, found = check(tmp_path, rows(100), train[:100], schema=curated)
    assert "'oops'" in found[("size", "FLOAT_TYPE_STRING_NOT_FLOAT")]


def test_out_of_range_and_missing_rate(tmp_path):
    config = ValidationConfig(infer_ranges=True, max_missing_fraction=0.1)
    bad = rows(100, seed=3)
    bad[0]["count"] = 99
    for row in bad[:30]:
        row["size"] = None
    _, found = check(tmp_path, rows(300), bad, config=config)
    assert "99" in found[("count", "INT_TYPE_BIG_INT")]
    assert "30%" in found[("size", "FEATURE_TYPE_LOW_FRACTION_PRESENT")]


def test_infinite_values(tmp_path):
    """An inf (a division by zero upstream) is reported where the inferred schema disallows it, and
    the statistics keep it out of the mean."""
    bad = rows(100, seed=5)
    bad[7]["size"] = float("-inf")
    stats = stats_of(tmp_path, "bad", bad)
    size = next(f for f in stats.features if f.name == "size").num_stats
    assert size.min == float("-inf") and np.isfinite(size.mean) and np.isfinite(size.std_dev)
    _, found = check(tmp_path, rows(300), bad)
    assert "'size' has infinite values" in found[("size", "FLOAT_TYPE_HAS_INF")]
    allowed = infer_schema(stats_of(tmp_path, "train", rows(300)), ValidationConfig())
    next(f for f in allowed.feature if f.name == "size").float_domain.disallow_inf = False
    _, found = check(tmp_path, rows(300), bad, schema=allowed)
    assert ("size", "FLOAT_TYPE_HAS_INF") not in found


def test_skew_linf_for_categories_and_js_for_numbers(tmp_path):
    _, found = check(tmp_path, rows(300), rows(150, seed=4, shift=6.0, colors=("red",) * 8 + ("green", "blue")))
    assert "Jensen-Shannon" in found[("size", "COMPARATOR_JENSEN_SHANNON_DIVERGENCE_HIGH")]
    assert "'red'" in found[("color", "COMPARATOR_L_INFTY_HIGH")]
    assert ("count", "COMPARATOR_JENSEN_SHANNON_DIVERGENCE_HIGH") not in found


def test_distances(tmp_path):
    a = stats_of(tmp_path, "a", rows(400, seed=5))
    b = stats_of(tmp_path, "b", rows(400, seed=6))
    c = stats_of(tmp_path, "c", rows(400, seed=7, shift=20.0, colors=("red",)))
    by = lambda s: {f.name: f for f in s.features}  # noqa: E731
    assert js_divergence(by(a)["size"], by(a)["size"]) == pytest.approx(0.0, abs=1e-9)
    assert js_divergence(by(a)["size"], by(b)["size"]) < 0.1
    assert js_divergence(by(a)["size"], by(c)["size"]) == pytest.approx(1.0, abs=1e-6)  # disjoint supports
    gap, value = linf_distance(by(a)["color"], by(c)["color"])
    assert gap == pytest.approx(1 - 134 / 400, abs=1e-6) and value == "red"


def test_bad_curated_schema_names_the_file(tmp_path):
    path = tmp_path / "schema.pbtxt"
    path.write_text("feature { nme: 'x' }")
    with pytest.raises(ValueError, match="schema.pbtxt: not a valid tensorflow-metadata Schema"):
        load_schema(str(path))


def test_statistics_merge_across_files_as_in_one_pass(tmp_path):
    """Beam summarizes each file apart and merges: the exact figures must equal one pass's, the
    sketched ones stay within their stated error, and a summary's size does not grow with rows."""
    import pickle

    import apache_beam as beam

    import pyarrow as pa

    from validation.statistics import QUANTILES_EPS, FeatureSummary, StatisticsCombineFn

    data = rows(3000, seed=1)
    for i, row in enumerate(data):
        row["code"] = f"c{i % 1500}"  # more distinct values than the rank histogram keeps exactly
    files = [write_split(tmp_path / f"part{k}.gz", data[k::3]) for k in range(3)]
    whole = stats_of(tmp_path, "train", data)
    with beam.Pipeline() as pipeline:
        (pipeline | beam.Create(files) | beam.CombineGlobally(StatisticsCombineFn("train"))
         | beam.Map(lambda stats: write_statistics(str(tmp_path / "merged"), stats)))
    merged = read_statistics(str(tmp_path / "merged"))
    by_whole = {f.name: f for f in whole.features}
    by_merged = {f.name: f for f in merged.features}
    assert merged.num_examples == whole.num_examples == 3000
    size_a, size_b = by_whole["size"].num_stats, by_merged["size"].num_stats
    assert (size_b.min, size_b.max, size_b.common_stats.num_non_missing) == (size_a.min, size_a.max, 3000)
    assert size_b.mean == pytest.approx(size_a.mean, rel=1e-12) and size_b.std_dev == pytest.approx(size_a.std_dev, rel=1e-9)
    values = np.sort(np.array([r["size"] for r in data], np.float32).astype(np.float64))
    rank = np.searchsorted(values, size_b.median) / values.size
    assert abs(rank - 0.5) <= QUANTILES_EPS + 1 / values.size
    standard = [h for h in size_b.histograms if h.type == statistics_pb2.Histogram.STANDARD][0]
    exact, _ = np.histogram(values, bins=[b.low_value for b in standard.buckets] + [standard.buckets[-1].high_value])
    assert np.abs(np.array([b.sample_count for b in standard.buckets]) - exact).max() <= 3000 * (QUANTILES_EPS + 1e-3) + 1
    color = by_merged["color"].string_stats
    assert color.unique == 3 and {v.value: v.frequency for v in color.top_values} == {"red": 1000, "green": 1000, "blue": 1000}
    code = by_merged["code"].string_stats
    assert abs(code.unique - 1500) <= 1500 * 0.05  # KMV estimate beyond its exact range
    # A summary holds sketches of bounded size, not the values: 10x the rows pickle alike.
    def pickled_size(n: int) -> int:
        numbers, strings = FeatureSummary(), FeatureSummary()
        for start in range(0, n, 4096):
            chunk = np.random.default_rng(start).normal(size=min(4096, n - start))
            numbers.add("x", pa.array([[v] for v in chunk], pa.large_list(pa.float32())))
            strings.add("s", pa.array([[f"v{int(v * 1000)}".encode()] for v in chunk], pa.large_list(pa.large_binary())))
        return len(pickle.dumps((numbers, strings)))

    assert pickled_size(400_000) < 1.2 * pickled_size(40_000)


def test_statistics_combine_merges_a_file_batch_by_batch(tmp_path, monkeypatch):
    """A file's batch summaries are merged as they are read, never all held at once (they
    would grow with the file: each holds its own sketches)."""
    from validation import statistics

    path = write_split(tmp_path / "train.gz", rows(50))
    real_read, merges, seen_before = statistics.read_summaries, [], []
    real_merge = statistics.FeatureSummary.merge

    def counting_merge(self, name, other):
        merges.append(name)
        return real_merge(self, name, other)

    def read_in_small_batches(files):
        for part in real_read(files, batch_size=5):
            seen_before.append(len(merges))
            yield part

    monkeypatch.setattr(statistics.FeatureSummary, "merge", counting_merge)
    monkeypatch.setattr(statistics, "read_summaries", read_in_small_batches)
    combine = statistics.StatisticsCombineFn("train")
    total, features = combine.add_input(combine.create_accumulator(), path)
    assert total == 50 and len(seen_before) == 10
    # When the k-th batch is read, the batches before it (less the first) were merged already.
    assert all(merged >= 3 * (k - 1) for k, merged in enumerate(seen_before)), seen_before


def test_a_fixed_length_list_feature_is_inferred_as_tfdv_does_and_tfx_bsl_reads_it():
    """A feature with the same count of values in every example (an image's 784 floats) gets a
    shape and, as TFDV infers it, presence 1: tfx_bsl (Transform's reader) refuses a shape beside
    a presence below 1."""
    from tensorflow_transform.tf_metadata import schema_utils

    stats = statistics_pb2.DatasetFeatureStatistics(num_examples=10)
    feature = stats.features.add(name="pixels", type=statistics_pb2.FeatureNameStatistics.FLOAT)
    common = feature.num_stats.common_stats
    common.num_non_missing, common.min_num_values, common.max_num_values = 10, 4, 4
    schema = infer_schema(stats, ValidationConfig(max_missing_fraction=0.5))
    (pixels,) = schema.feature
    assert [d.size for d in pixels.shape.dim] == [4] and pixels.presence.min_fraction == 1.0
    spec = schema_utils.schema_as_feature_spec(schema).feature_spec
    assert spec["pixels"] == tf.io.FixedLenFeature([4], tf.float32)
