"""Feature statistics of tf.Example TFRecords as a tensorflow-metadata DatasetFeatureStatistics.

Records are decoded in batches to Arrow with tfx-bsl's decoder (the one TFDV uses), then each
column is summarized with NumPy: counts and missing for all; min/max/mean/std/median, an
equal-width and a quantiles histogram for numbers; distinct count, top values and the full rank
histogram (up to RANK_BUCKETS values) for strings. The stored layout is TFDV's: one
`DatasetFeatureStatisticsList` per split in `Split-<name>/FeatureStats.pb`.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import tensorflow as tf
from tensorflow_metadata.proto.v0 import statistics_pb2
from tfx_bsl.coders import example_coder

STATS_FILE = "FeatureStats.pb"  # tfx.components.statistics_gen.executor.DEFAULT_FILE_NAME
HISTOGRAM_BUCKETS = 10
TOP_VALUES = 20
RANK_BUCKETS = 1000

FNS = statistics_pb2.FeatureNameStatistics


@dataclass
class _Column:
    kind: str | None = None  # "INT", "FLOAT", "STRING"; None until a value is seen
    present: int = 0  # examples with at least one value
    value_counts: list[np.ndarray] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)


def _kind(arrow_type: pa.DataType) -> str | None:
    item = arrow_type.value_type if pa.types.is_large_list(arrow_type) or pa.types.is_list(arrow_type) else arrow_type
    if pa.types.is_integer(item):
        return "INT"
    if pa.types.is_floating(item):
        return "FLOAT"
    if pa.types.is_binary(item) or pa.types.is_large_binary(item) or pa.types.is_string(item):
        return "STRING"
    return None  # null: no example in this batch has the feature


def read_columns(file_pattern: str, batch_size: int = 4096) -> tuple[int, dict[str, _Column]]:
    """Reads GZIP TFRecords of tf.Examples; returns the number of examples and the columns."""
    files = sorted(tf.io.gfile.glob(file_pattern))
    if not files:
        raise FileNotFoundError(f"no TFRecord files match {file_pattern}")
    decoder = example_coder.ExamplesToRecordBatchDecoder()
    columns: dict[str, _Column] = {}
    total = 0
    dataset = tf.data.TFRecordDataset(files, compression_type="GZIP").batch(batch_size)
    for records in dataset.as_numpy_iterator():
        try:
            batch = decoder.DecodeBatch(list(records))
        except RuntimeError as exc:  # e.g. one feature stored as int64 in some examples, float in others
            raise ValueError(f"{file_pattern}: examples disagree on a feature's type: {exc}") from None
        total += batch.num_rows
        for name, array in zip(batch.schema.names, batch.columns):
            column = columns.setdefault(name, _Column())
            kind = _kind(array.type)
            if kind is None:
                continue
            if column.kind not in (None, kind):
                if {column.kind, kind} == {"INT", "FLOAT"}:
                    kind = "FLOAT"
                else:
                    raise ValueError(f"feature '{name}' holds both {column.kind} and {kind} values in {file_pattern}")
            column.kind = kind
            lengths = array.value_lengths().to_numpy(zero_copy_only=False)
            lengths = np.nan_to_num(lengths.astype(np.float64), nan=0.0).astype(np.int64)
            column.present += int(np.count_nonzero(~np.asarray(array.is_null())))
            column.value_counts.append(lengths[~np.asarray(array.is_null())])
            flat = array.flatten()
            column.values.append(flat.to_numpy(zero_copy_only=False))
    return total, columns


def _common(column: _Column, total: int) -> statistics_pb2.CommonStatistics:
    counts = np.concatenate(column.value_counts) if column.value_counts else np.zeros(0, np.int64)
    common = statistics_pb2.CommonStatistics(
        num_non_missing=column.present,
        num_missing=total - column.present,
        tot_num_values=int(counts.sum()),
    )
    if counts.size:
        common.min_num_values = int(counts.min())
        common.max_num_values = int(counts.max())
        common.avg_num_values = float(counts.mean())
    return common


def _standard_histogram(values: np.ndarray) -> statistics_pb2.Histogram:
    histogram = statistics_pb2.Histogram(type=statistics_pb2.Histogram.STANDARD)
    if values.size == 0:
        return histogram
    counts, edges = np.histogram(values, bins=HISTOGRAM_BUCKETS)
    for low, high, count in zip(edges[:-1], edges[1:], counts):
        histogram.buckets.add(low_value=float(low), high_value=float(high), sample_count=float(count))
    return histogram


def _quantiles_histogram(values: np.ndarray) -> statistics_pb2.Histogram:
    histogram = statistics_pb2.Histogram(type=statistics_pb2.Histogram.QUANTILES)
    if values.size == 0:
        return histogram
    edges = np.quantile(values, np.linspace(0.0, 1.0, HISTOGRAM_BUCKETS + 1))
    per_bucket = values.size / HISTOGRAM_BUCKETS
    for low, high in zip(edges[:-1], edges[1:]):
        histogram.buckets.add(low_value=float(low), high_value=float(high), sample_count=per_bucket)
    return histogram


def _numeric(name: str, column: _Column, total: int) -> statistics_pb2.FeatureNameStatistics:
    values = np.concatenate(column.values).astype(np.float64) if column.values else np.zeros(0)
    finite = values[np.isfinite(values)]
    stats = statistics_pb2.NumericStatistics(common_stats=_common(column, total))
    numbers = values[~np.isnan(values)]
    if numbers.size:  # min and max show infinities, as TFDV's do; the rest is of the finite values
        stats.min = float(numbers.min())
        stats.max = float(numbers.max())
    if finite.size:
        stats.mean = float(finite.mean())
        stats.std_dev = float(finite.std())
        stats.median = float(np.median(finite))
        stats.num_zeros = int(np.count_nonzero(finite == 0))
    stats.histograms.append(_standard_histogram(finite))
    stats.histograms.append(_quantiles_histogram(finite))
    kind = FNS.INT if column.kind == "INT" else FNS.FLOAT
    return FNS(name=name, type=kind, num_stats=stats)


def _string(name: str, column: _Column, total: int) -> statistics_pb2.FeatureNameStatistics:
    counter: Counter[bytes] = Counter()
    lengths = 0
    for chunk in column.values:
        for value in chunk:
            counter[value] += 1
            lengths += len(value)
    stats = statistics_pb2.StringStatistics(common_stats=_common(column, total), unique=len(counter))
    seen = sum(counter.values())
    if seen:
        stats.avg_length = lengths / seen
    ranked = sorted(counter.items(), key=lambda item: (-item[1], item[0]))
    for value, count in ranked[:TOP_VALUES]:
        stats.top_values.add(value=value.decode("utf-8", "replace"), frequency=float(count))
    for rank, (value, count) in enumerate(ranked[:RANK_BUCKETS]):
        stats.rank_histogram.buckets.add(
            low_rank=rank, high_rank=rank, label=value.decode("utf-8", "replace"), sample_count=float(count)
        )
    return FNS(name=name, type=FNS.STRING, string_stats=stats)


def compute_statistics(file_pattern: str, name: str) -> statistics_pb2.DatasetFeatureStatistics:
    """Statistics of one split (`name`, e.g. "train") read from `file_pattern`."""
    total, columns = read_columns(file_pattern)
    dataset = statistics_pb2.DatasetFeatureStatistics(name=name, num_examples=total)
    for feature, column in sorted(columns.items()):
        if column.kind == "STRING":
            dataset.features.append(_string(feature, column, total))
        elif column.kind in ("INT", "FLOAT"):
            dataset.features.append(_numeric(feature, column, total))
        else:  # The feature key exists but never holds a value: record it as all missing.
            empty = statistics_pb2.StringStatistics(common_stats=_common(column, total))
            dataset.features.append(FNS(name=feature, type=FNS.STRING, string_stats=empty))
    return dataset


def write_statistics(split_dir: str, stats: statistics_pb2.DatasetFeatureStatistics) -> str:
    """Writes `<split_dir>/FeatureStats.pb` (a binary DatasetFeatureStatisticsList), as TFDV does."""
    tf.io.gfile.makedirs(split_dir)
    path = os.path.join(split_dir, STATS_FILE)
    payload = statistics_pb2.DatasetFeatureStatisticsList(datasets=[stats]).SerializeToString()
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(payload)
    return path


def read_statistics(split_dir: str) -> statistics_pb2.DatasetFeatureStatistics:
    path = os.path.join(split_dir, STATS_FILE)
    with tf.io.gfile.GFile(path, "rb") as f:
        stats_list = statistics_pb2.DatasetFeatureStatisticsList.FromString(f.read())
    if len(stats_list.datasets) != 1:
        raise ValueError(f"{path}: expected one dataset, found {len(stats_list.datasets)}")
    return stats_list.datasets[0]


def common_stats(feature: statistics_pb2.FeatureNameStatistics) -> statistics_pb2.CommonStatistics:
    which = feature.WhichOneof("stats")
    return getattr(feature, which).common_stats if which in ("num_stats", "string_stats") else statistics_pb2.CommonStatistics()


def value_counts(feature: statistics_pb2.FeatureNameStatistics) -> dict[str, float]:
    """A string feature's values and their counts (from the rank histogram)."""
    return {b.label: b.sample_count for b in feature.string_stats.rank_histogram.buckets}
