"""Feature statistics of tf.Example TFRecords as a tensorflow-metadata DatasetFeatureStatistics.

Records are decoded in batches to Arrow with tfx-bsl's decoder (the one TFDV uses) and folded
into mergeable summaries of bounded size, so a split is summarized in one pass, in parts that
Beam can spread over workers and merge (`StatisticsCombineFn`):
- exact: counts, missing, values per example, min, max, mean and standard deviation (Chan's
  parallel update), zeros, string lengths;
- tfx-bsl's quantiles sketch (rank error <= QUANTILES_EPS): the median, the QUANTILES histogram
  and the STANDARD (equal-width) histogram, whose counts are read off the sketch's distribution
  at CDF_POINTS ranks, as TFDV builds it;
- Misra-Gries (RANK_BUCKETS counters): top values and the rank histogram, exact while a feature
  has at most RANK_BUCKETS distinct values, else each count is low by at most total / RANK_BUCKETS;
- KMV (UNIQUE_BUCKETS hashes): the number of distinct values, exact up to UNIQUE_BUCKETS, else
  within about 1/sqrt(UNIQUE_BUCKETS) (~1.6%).
The stored layout is TFDV's: one `DatasetFeatureStatisticsList` per split in
`Split-<name>/FeatureStats.pb`.
"""
from __future__ import annotations

import itertools
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tensorflow as tf
from tensorflow_metadata.proto.v0 import statistics_pb2
from tfx_bsl import sketches
from tfx_bsl.coders import example_coder

from ingestion import images

STATS_FILE = "FeatureStats.pb"  # tfx.components.statistics_gen.executor.DEFAULT_FILE_NAME
HISTOGRAM_BUCKETS = 10
TOP_VALUES = 20
RANK_BUCKETS = 1000
UNIQUE_BUCKETS = 4096
QUANTILES_EPS = 0.01  # TFDV's default
CDF_POINTS = 1000

FNS = statistics_pb2.FeatureNameStatistics


def _kind(arrow_type: pa.DataType) -> str | None:
    item = arrow_type.value_type if pa.types.is_large_list(arrow_type) or pa.types.is_list(arrow_type) else arrow_type
    if pa.types.is_integer(item):
        return "INT"
    if pa.types.is_floating(item):
        return "FLOAT"
    if pa.types.is_binary(item) or pa.types.is_large_binary(item) or pa.types.is_string(item):
        return "STRING"
    return None  # null: no example in this batch has the feature


class _Numbers:
    """Running moments, extremes and a quantiles sketch of a numeric feature's values."""

    def __init__(self):
        self.count, self.mean, self.m2 = 0, 0.0, 0.0  # finite values only
        self.min, self.max = np.inf, -np.inf  # infinities included, as TFDV shows them
        self.zeros = 0
        self.sketch = sketches.QuantilesSketch(QUANTILES_EPS, 1 << 32, 1)

    def add(self, values: np.ndarray) -> None:
        values = values.astype(np.float64)
        numbers = values[~np.isnan(values)]
        if numbers.size:
            self.min, self.max = min(self.min, numbers.min()), max(self.max, numbers.max())
        finite = numbers[np.isfinite(numbers)]
        if finite.size:
            other = _Numbers.__new__(_Numbers)
            other.count, other.mean, other.m2 = finite.size, float(finite.mean()), float(((finite - finite.mean()) ** 2).sum())
            self._merge_moments(other)
            self.zeros += int(np.count_nonzero(finite == 0))
            self.sketch.AddValues(pa.array(finite))

    def _merge_moments(self, other: "_Numbers") -> None:
        total = self.count + other.count
        delta = other.mean - self.mean
        self.mean += delta * other.count / total
        self.m2 += other.m2 + delta * delta * self.count * other.count / total
        self.count = total

    def merge(self, other: "_Numbers") -> None:
        if other.count:
            self._merge_moments(other)
        self.min, self.max, self.zeros = min(self.min, other.min), max(self.max, other.max), self.zeros + other.zeros
        self.sketch.Merge(other.sketch)

    def __getstate__(self):  # compacted first: the sketch then pickles at its bounded size
        self.sketch.Compact()
        return self.__dict__

    def quantiles(self, buckets: int) -> np.ndarray:
        return np.asarray(self.sketch.GetQuantiles(buckets).flatten(), np.float64)


def _is_image(values: pa.Array) -> np.ndarray:
    """Each value's ingestion.images.looks_like_image, the signatures matched in Arrow; only values
    with a text-like signature (GIF, BMP) are looked at one by one."""
    binary = values.cast(pa.large_binary())
    hits = np.zeros(len(binary), bool)
    for signature in images.BINARY_SIGNATURES:
        hits |= np.asarray(pc.starts_with(binary, pattern=signature).fill_null(False), bool)
    for signature in images.TEXT_SIGNATURES:
        for i in np.flatnonzero(np.asarray(pc.starts_with(binary, pattern=signature).fill_null(False), bool)):
            hits[i] = not images.is_text(binary[i].as_py())
    return hits


class _Strings:
    """Top values (Misra-Gries), distinct count (KMV) and total length of a string feature.
    Encoded images (by their first bytes) are counted, sized and hashed into KMV, but kept out of
    the top values: a feature of images gets TFDV's bytes statistics, not a rank histogram of blobs."""

    def __init__(self):
        self.top = sketches.MisraGriesSketch(RANK_BUCKETS)
        self.distinct = sketches.KmvSketch(UNIQUE_BUCKETS)
        self.count, self.length = 0, 0
        self.images, self.min_bytes, self.max_bytes = 0, None, None

    def add(self, values: pa.Array) -> None:
        self.distinct.AddValues(values)
        images = _is_image(values) if len(values) else np.zeros(0, bool)
        self.top.AddValues(values.filter(pa.array(~images)) if images.any() else values)
        self.count += len(values)
        lengths = np.asarray(pc.binary_length(values).fill_null(0), np.int64)
        self.length += int(lengths.sum())
        self.images += int(images.sum())
        if len(lengths):
            low, high = int(lengths.min()), int(lengths.max())
            self.min_bytes = low if self.min_bytes is None else min(self.min_bytes, low)
            self.max_bytes = high if self.max_bytes is None else max(self.max_bytes, high)

    @property
    def all_images(self) -> bool:
        return self.count > 0 and self.images == self.count

    def merge(self, other: "_Strings") -> None:
        self.top.Merge(other.top)
        self.distinct.Merge(other.distinct)
        self.count, self.length = self.count + other.count, self.length + other.length
        self.images += other.images
        for attr, pick in (("min_bytes", min), ("max_bytes", max)):
            mine, theirs = getattr(self, attr), getattr(other, attr)
            setattr(self, attr, theirs if mine is None else mine if theirs is None else pick(mine, theirs))

    def __getstate__(self):  # the sketches pickle through their own serialization
        return (self.top.Serialize(), self.distinct.Serialize(), self.count, self.length, self.images,
                self.min_bytes, self.max_bytes)

    def __setstate__(self, state):
        top, distinct, self.count, self.length, self.images, self.min_bytes, self.max_bytes = state
        self.top = sketches.MisraGriesSketch.Deserialize(top)
        self.distinct = sketches.KmvSketch.Deserialize(distinct)


class FeatureSummary:
    """One feature over a part of a split: presence, values per example, and its values' summary."""

    def __init__(self):
        self.kind: str | None = None  # "INT", "FLOAT", "STRING"; None until a value is seen
        self.present = 0  # examples with the feature (TFDV's count: an empty value list is present)
        self.empty = 0  # ... of which with an empty value list (a missing CSV cell)
        self.values = 0
        self.min_values, self.max_values = None, None
        self.numbers: _Numbers | None = None
        self.strings: _Strings | None = None

    def _set_kind(self, kind: str, name: str) -> None:
        if self.kind not in (None, kind) and {self.kind, kind} != {"INT", "FLOAT"}:
            raise ValueError(f"feature '{name}' holds both {self.kind} and {kind} values")
        self.kind = "FLOAT" if {self.kind, kind} == {"INT", "FLOAT"} else kind
        if self.kind == "STRING":
            self.strings = self.strings or _Strings()
        else:
            self.numbers = self.numbers or _Numbers()

    def add(self, name: str, array: pa.Array) -> None:
        kind = _kind(array.type)
        if kind is None:
            return
        self._set_kind(kind, name)
        present = ~np.asarray(array.is_null())
        lengths = np.asarray(array.value_lengths().fill_null(0), np.int64)[present]
        if lengths.size:
            self._count(int(present.sum()), int(lengths.sum()), int(lengths.min()), int(lengths.max()))
            self.empty += int(np.count_nonzero(lengths == 0))
        flat = array.flatten()
        if self.kind == "STRING":
            self.strings.add(flat)
        else:
            self.numbers.add(flat.to_numpy(zero_copy_only=False))

    def _count(self, present: int, values: int, low, high) -> None:
        self.present += present
        self.values += values
        if low is not None:
            self.min_values = int(low) if self.min_values is None else min(self.min_values, int(low))
            self.max_values = int(high) if self.max_values is None else max(self.max_values, int(high))

    def merge(self, name: str, other: "FeatureSummary") -> None:
        if other.kind is not None:
            self._set_kind(other.kind, name)
        self._count(other.present, other.values, other.min_values, other.max_values)
        self.empty += other.empty
        for part in ("numbers", "strings"):
            mine, theirs = getattr(self, part), getattr(other, part)
            if theirs is not None:
                if mine is None:
                    setattr(self, part, theirs)
                else:
                    mine.merge(theirs)

    def common(self, total: int) -> statistics_pb2.CommonStatistics:
        present, low = self.present, self.min_values
        if (self.max_values or 0) <= 1 and self.empty:  # one value or none (a CSV column): no value is a missing value
            present, low = present - self.empty, 1
        common = statistics_pb2.CommonStatistics(num_non_missing=present, num_missing=total - present,
                                                  tot_num_values=self.values)
        if present:
            common.min_num_values, common.max_num_values = low, self.max_values
            common.avg_num_values = self.values / present
        return common


def summarize(records: list[bytes], decoder=None) -> tuple[int, dict[str, FeatureSummary]]:
    """(examples, {feature: FeatureSummary}) of one batch of serialized tf.Examples."""
    decoder = decoder or example_coder.ExamplesToRecordBatchDecoder()
    try:
        batch = decoder.DecodeBatch(records)
    except RuntimeError as exc:  # e.g. one feature stored as int64 in some examples, float in others
        raise ValueError(f"examples disagree on a feature's type: {exc}") from None
    return summarize_batch(batch)


def summarize_batch(batch: pa.RecordBatch) -> tuple[int, dict[str, FeatureSummary]]:
    """(examples, {feature: FeatureSummary}) of a batch in the decoder's layout (a list column per feature)."""
    features = {}
    for name, array in zip(batch.schema.names, batch.columns):
        features[name] = FeatureSummary()
        features[name].add(name, array)
    return batch.num_rows, features


def read_summaries(files: list[str], batch_size: int = 4096):
    """(examples, {feature: FeatureSummary}) per batch of GZIP TFRecords of tf.Examples."""
    decoder = example_coder.ExamplesToRecordBatchDecoder()
    for records in tf.data.TFRecordDataset(files, compression_type="GZIP").batch(batch_size).as_numpy_iterator():
        try:
            yield summarize(list(records), decoder)
        except ValueError as exc:
            raise ValueError(f"{files}: {exc}") from None


def merge_summaries(parts) -> tuple[int, dict[str, FeatureSummary]]:
    total, merged = 0, {}
    for examples, features in parts:
        total += examples
        for name, summary in features.items():
            if name in merged:
                merged[name].merge(name, summary)
            else:
                merged[name] = summary
    return total, merged


def _standard_histogram(numbers: _Numbers) -> statistics_pb2.Histogram:
    """Equal-width buckets between the finite min and max; counts from the sketch's distribution."""
    histogram = statistics_pb2.Histogram(type=statistics_pb2.Histogram.STANDARD)
    if not numbers.count:
        return histogram
    points = numbers.quantiles(CDF_POINTS)
    low, high = points[0], points[-1]
    edges = np.linspace(low, high, HISTOGRAM_BUCKETS + 1)
    ranks = np.interp(edges, points, np.linspace(0.0, 1.0, CDF_POINTS + 1))
    ranks[0], ranks[-1] = 0.0, 1.0
    cumulative = np.round(ranks * numbers.count)
    for a, b, count in zip(edges[:-1], edges[1:], np.diff(cumulative)):
        histogram.buckets.add(low_value=float(a), high_value=float(b), sample_count=float(count))
    return histogram


def _quantiles_histogram(numbers: _Numbers) -> statistics_pb2.Histogram:
    histogram = statistics_pb2.Histogram(type=statistics_pb2.Histogram.QUANTILES)
    if not numbers.count:
        return histogram
    edges = numbers.quantiles(HISTOGRAM_BUCKETS)
    for low, high in zip(edges[:-1], edges[1:]):
        histogram.buckets.add(low_value=float(low), high_value=float(high), sample_count=numbers.count / HISTOGRAM_BUCKETS)
    return histogram


def _numeric(name: str, summary: FeatureSummary, total: int) -> FNS:
    numbers = summary.numbers
    stats = statistics_pb2.NumericStatistics(common_stats=summary.common(total))
    if numbers.min <= numbers.max:  # some value that is not NaN
        stats.min, stats.max = float(numbers.min), float(numbers.max)
    if numbers.count:
        stats.mean = numbers.mean
        stats.std_dev = float(np.sqrt(numbers.m2 / numbers.count))
        stats.median = float(numbers.quantiles(2)[1])
        stats.num_zeros = numbers.zeros
    stats.histograms.append(_standard_histogram(numbers))
    stats.histograms.append(_quantiles_histogram(numbers))
    return FNS(name=name, type=FNS.INT if summary.kind == "INT" else FNS.FLOAT, num_stats=stats)


IMAGE_DOMAIN_INFO = "image_domain {}"  # TFDV's custom statistic "domain_info" for an image feature


def _image_bytes(name: str, summary: FeatureSummary, total: int) -> FNS:
    """TFDV's layout for a feature of encoded images: BYTES with bytes_stats, and the
    `domain_info` custom statistic that schema inference turns into `image_domain`."""
    strings = summary.strings
    stats = statistics_pb2.BytesStatistics(common_stats=summary.common(total), unique=strings.distinct.Estimate(),
                                           avg_num_bytes=strings.length / strings.count,
                                           min_num_bytes=strings.min_bytes, max_num_bytes=strings.max_bytes)
    feature = FNS(name=name, type=FNS.BYTES, bytes_stats=stats)
    feature.custom_stats.add(name="domain_info", str=IMAGE_DOMAIN_INFO)
    return feature


def is_image_feature(feature: FNS) -> bool:
    return any(c.name == "domain_info" and c.str == IMAGE_DOMAIN_INFO for c in feature.custom_stats)


def _string(name: str, summary: FeatureSummary, total: int) -> FNS:
    strings = summary.strings
    if strings.all_images:
        return _image_bytes(name, summary, total)
    stats = statistics_pb2.StringStatistics(common_stats=summary.common(total), unique=strings.distinct.Estimate())
    if strings.count:
        stats.avg_length = strings.length / strings.count
    top = strings.top.Estimate()
    values, counts = top.field(0).to_pylist(), top.field(1).to_pylist()
    ranked = sorted(zip(values, counts), key=lambda item: (-item[1], item[0]))
    for value, count in ranked[:TOP_VALUES]:
        stats.top_values.add(value=value.decode("utf-8", "replace"), frequency=float(count))
    for rank, (value, count) in enumerate(ranked):
        stats.rank_histogram.buckets.add(low_rank=rank, high_rank=rank, label=value.decode("utf-8", "replace"),
                                         sample_count=float(count))
    return FNS(name=name, type=FNS.STRING, string_stats=stats)


def to_statistics(name: str, total: int, features: dict[str, FeatureSummary]) -> statistics_pb2.DatasetFeatureStatistics:
    dataset = statistics_pb2.DatasetFeatureStatistics(name=name, num_examples=total)
    for feature, summary in sorted(features.items()):
        if summary.kind == "STRING":
            dataset.features.append(_string(feature, summary, total))
        elif summary.kind in ("INT", "FLOAT"):
            dataset.features.append(_numeric(feature, summary, total))
        else:  # The feature key exists but never holds a value: record it as all missing.
            empty = statistics_pb2.StringStatistics(common_stats=summary.common(total))
            dataset.features.append(FNS(name=feature, type=FNS.STRING, string_stats=empty))
    return dataset


def split_files(file_pattern: str) -> list[str]:
    files = sorted(tf.io.gfile.glob(file_pattern))
    if not files:
        raise FileNotFoundError(f"no TFRecord files match {file_pattern}")
    return files


def compute_statistics(file_pattern: str, name: str) -> statistics_pb2.DatasetFeatureStatistics:
    """Statistics of one split (`name`, e.g. "train") read from `file_pattern`, in this process."""
    try:
        return to_statistics(name, *merge_summaries(read_summaries(split_files(file_pattern))))
    except ValueError as exc:
        raise ValueError(f"{file_pattern}: {exc}") from None


class ExampleStatistics:
    """Statistics of serialized tf.Examples given one at a time (e.g. the requests a server
    logged), summarized in batches and merged as a split's files are: memory holds one batch.
    Examples from several clients may disagree on a number's type: that feature is then FLOAT."""

    def __init__(self, batch_size: int = 4096):
        self._decoder = example_coder.ExamplesToRecordBatchDecoder()
        self._batch: list[bytes] = []
        self._batch_size = batch_size
        self._merged: tuple[int, dict[str, FeatureSummary]] = (0, {})

    def add(self, serialized: bytes) -> None:
        self._batch.append(serialized)
        if len(self._batch) >= self._batch_size:
            self._flush()

    def add_batch(self, batch: pa.RecordBatch) -> None:
        """A batch already in the decoder's layout (e.g. a model's predictions, built as columns)."""
        self._flush()
        self._merged = merge_summaries([self._merged, summarize_batch(batch)])

    def _flush(self) -> None:
        if not self._batch:
            return
        try:
            parts = [summarize(self._batch, self._decoder)]
        except ValueError:  # clients sent a feature as int64 and as float: one at a time, merged as FLOAT
            parts = [summarize([record], self._decoder) for record in self._batch]
        self._merged = merge_summaries([self._merged, *parts])
        self._batch = []

    def result(self, name: str) -> statistics_pb2.DatasetFeatureStatistics:
        self._flush()
        return to_statistics(name, *self._merged)


class SummaryCombineFn(beam.CombineFn):
    """A split's statistics from summaries of its parts (`summarize_batch`'s), merged where Beam runs them."""

    def __init__(self, name: str):
        self._name = name

    def create_accumulator(self):
        return 0, {}

    def add_input(self, accumulator, summary):
        return merge_summaries([accumulator, summary])

    def merge_accumulators(self, accumulators):
        return merge_summaries(accumulators)

    def extract_output(self, accumulator) -> statistics_pb2.DatasetFeatureStatistics:
        return to_statistics(self._name, *accumulator)


class StatisticsCombineFn(SummaryCombineFn):
    """A split's statistics from its files (each file summarized where Beam runs it, then merged)."""

    def add_input(self, accumulator, path: str):
        # Batch by batch: a list of the file's batch summaries would grow with the file.
        return merge_summaries(itertools.chain([accumulator], read_summaries([path])))


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
    return getattr(feature, which).common_stats if which in ("num_stats", "string_stats", "bytes_stats") \
        else statistics_pb2.CommonStatistics()


def value_counts(feature: statistics_pb2.FeatureNameStatistics) -> dict[str, float]:
    """A string feature's values and their counts (from the rank histogram)."""
    return {b.label: b.sample_count for b in feature.string_stats.rank_histogram.buckets}


def find_feature(stats: statistics_pb2.DatasetFeatureStatistics, column: str) -> statistics_pb2.FeatureNameStatistics | None:
    return next((f for f in stats.features if f.name == column or list(f.path.step) == [column]), None)


def exact_value_counts(stats: statistics_pb2.DatasetFeatureStatistics, column: str) -> dict[str, int] | None:
    """A string column's values and their counts, when the rank histogram holds them exactly (its
    counts add up to the column's values: Misra-Gries dropped none, no value was an image) and
    every value is UTF-8 (none shows the replacement character); else None."""
    feature = find_feature(stats, column)
    if feature is None or feature.WhichOneof("stats") != "string_stats":
        return None
    counts = value_counts(feature)
    if sum(counts.values()) != common_stats(feature).tot_num_values or any("\ufffd" in value for value in counts):
        return None
    return {value: int(count) for value, count in counts.items()}


def exact_class_counts(stats: statistics_pb2.DatasetFeatureStatistics, column: str) -> dict[str, int] | None:
    """A string label's rows per class, named as trainer.features.class_name names them ("" is no
    class), when the statistics hold them exactly (exact_value_counts); else None (read the split)."""
    counts = exact_value_counts(stats, column)
    return None if counts is None else {value: n for value, n in counts.items() if value}


FLOAT32_EXACT_INTEGERS = 2**24  # every integer up to this size is a float32 exactly


def finite_mean(stats: statistics_pb2.DatasetFeatureStatistics, column: str) -> float | None:
    """A numeric column's mean over its finite values (as _Numbers keeps it) when it has some and
    they read the same as float32 (how the trainer parses a label): a FLOAT column without
    infinities, an INT column within +-2**24; else None."""
    feature = find_feature(stats, column)
    if feature is None or feature.WhichOneof("stats") != "num_stats" or feature.type not in (FNS.FLOAT, FNS.INT):
        return None
    numbers = feature.num_stats
    quantiles = [h for h in numbers.histograms if h.type == statistics_pb2.Histogram.QUANTILES]
    if not (quantiles and quantiles[0].buckets):  # _quantiles_histogram: buckets only with finite values
        return None
    if not (np.isfinite(numbers.min) and np.isfinite(numbers.max)):
        return None
    if feature.type == FNS.INT and max(abs(numbers.min), abs(numbers.max)) > FLOAT32_EXACT_INTEGERS:
        return None
    return float(numbers.mean)
