"""The CSV ExampleGen's statistics, computed while it writes the examples, are the ones StatisticsGen
would read back from them; StatisticsGen takes them only while a split's files are those summarized."""
from __future__ import annotations

import collections
import logging
import shutil

import numpy as np
import pytest
import tensorflow as tf
from tfx.types import artifact_utils, standard_artifacts

from components.ingest_statistics import recorded_statistics
from components.splits import split_pattern
from tests.conftest import mixed_csv, run_csv_example_gen
from validation.statistics import QUANTILES_EPS, RANK_BUCKETS, compute_statistics, read_statistics


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Two CSV files (several blocks' summaries merged) through the Arrow ExampleGen, cut 2:1."""
    folder = tmp_path_factory.mktemp("ingest")
    (folder / "in").mkdir()
    for seed in (1, 2):
        (folder / "in" / f"part{seed}.csv").write_text(mixed_csv(2500, seed), encoding="utf-8")
    examples = run_csv_example_gen(folder / "in", folder / "examples")
    examples.split_names = artifact_utils.encode_split_names(["train", "eval"])
    return examples


def _exact_part(stats):
    """The statistics less what depends on the order values were added in: each numeric feature's
    mean and deviation (sums in another order), and the top values of a feature with more distinct
    values than the Misra-Gries sketch counts exactly."""
    stats = type(stats).FromString(stats.SerializeToString())
    for feature in stats.features:
        if feature.HasField("num_stats"):
            feature.num_stats.ClearField("mean")
            feature.num_stats.ClearField("std_dev")
        elif feature.string_stats.unique > RANK_BUCKETS:
            feature.string_stats.ClearField("top_values")
            feature.string_stats.ClearField("rank_histogram")
    return stats


def assert_same_statistics(recorded, read) -> None:
    for ours, theirs in zip(recorded.features, read.features):
        if ours.HasField("num_stats"):
            assert ours.num_stats.mean == pytest.approx(theirs.num_stats.mean, rel=1e-12)
            assert ours.num_stats.std_dev == pytest.approx(theirs.num_stats.std_dev, rel=1e-12)
    assert _exact_part(recorded) == _exact_part(read)


def _values(examples, split: str, feature: str) -> list:
    files = tf.io.gfile.glob(split_pattern(examples, split))
    values = []
    for record in tf.data.TFRecordDataset(files, "GZIP").as_numpy_iterator():
        kind = tf.train.Example.FromString(record).features.feature[feature]
        values += list(getattr(kind, kind.WhichOneof("kind")).value)
    return values


def test_the_statistics_recorded_are_those_read_back(generated):
    for split in ("train", "eval"):
        recorded = recorded_statistics(generated, split)
        read = compute_statistics(split_pattern(generated, split), split)
        assert recorded is not None and recorded.num_examples == read.num_examples > 1000
        names = {f.name for f in recorded.features}
        assert names == {"id", "count", "ratio", "city", "code", "nothing"}
        assert_same_statistics(recorded, read)
        # Sketched figures hold their bounds whatever order the values arrived in: the median
        # within QUANTILES_EPS of its rank, a top value's count within total / RANK_BUCKETS.
        ids = np.sort(_values(generated, split, "id"))
        median = next(f for f in recorded.features if f.name == "id").num_stats.median
        assert abs(np.searchsorted(ids, median) / len(ids) - 0.5) <= QUANTILES_EPS + 1 / len(ids)
        codes = collections.Counter(_values(generated, split, "code"))
        top = next(f for f in recorded.features if f.name == "code").string_stats.top_values
        assert len(codes) > RANK_BUCKETS and len(top) == 20
        for value in top:
            assert abs(value.frequency - codes[value.value.encode()]) <= sum(codes.values()) / RANK_BUCKETS


def _run_statistics_gen(examples, out):
    from components.statistics_gen import StatisticsGen

    statistics = standard_artifacts.ExampleStatistics()
    statistics.uri = str(out)
    StatisticsGen.EXECUTOR_SPEC.executor_class().Do({"examples": [examples]}, {"statistics": [statistics]}, {})
    return {split: read_statistics(artifact_utils.get_split_uri([statistics], split)) for split in ("train", "eval")}


def test_statistics_gen_takes_them_and_reads_a_split_whose_files_changed(generated, tmp_path, caplog):
    copied = standard_artifacts.Examples()
    copied.uri = str(tmp_path / "examples")
    copied.split_names = generated.split_names
    shutil.copytree(generated.uri, copied.uri)
    caplog.set_level(logging.INFO, "loopline")
    taken = _run_statistics_gen(copied, tmp_path / "taken")
    assert caplog.text.count("computed while the ExampleGen wrote them") == 2
    assert taken == {split: recorded_statistics(copied, split) for split in ("train", "eval")}

    # One record fewer in the train split: its statistics are read from the files that are there.
    [train_file] = tf.io.gfile.glob(split_pattern(copied, "train"))
    records = list(tf.data.TFRecordDataset(train_file, "GZIP").as_numpy_iterator())
    with tf.io.TFRecordWriter(train_file, "GZIP") as writer:
        for record in records[1:]:
            writer.write(record)
    caplog.clear()
    changed = _run_statistics_gen(copied, tmp_path / "changed")
    assert "split 'train': its files are not those the ExampleGen summarized" in caplog.text
    assert changed["train"].num_examples == taken["train"].num_examples - 1
    assert changed["eval"] == taken["eval"]


def test_examples_without_recorded_statistics_are_read(generated, tmp_path):
    """An artifact from another ExampleGen (or from before this): no folder, so the files are read."""
    copied = standard_artifacts.Examples()
    copied.uri = str(tmp_path / "examples")
    copied.split_names = generated.split_names
    shutil.copytree(generated.uri, copied.uri, ignore=shutil.ignore_patterns("ingest_statistics"))
    assert recorded_statistics(copied, "train") is None
    statistics = _run_statistics_gen(copied, tmp_path / "read")
    assert_same_statistics(recorded_statistics(generated, "train"), statistics["train"])
