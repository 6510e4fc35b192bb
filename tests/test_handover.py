"""The columns the CSV ExampleGen hands over with each split's records are what the Trainer would
parse from those records, and are taken only for the very file they were written with."""
from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from functools import partial

import numpy as np
import pytest
import tensorflow as tf
from tfx.types import artifact_utils

from components.splits import EVAL_SPLIT, TRAIN_SPLIT, columns_dir, split_pattern
from ingestion import csv_records
from tests.conftest import REPO, mixed_csv, run_csv_example_gen, subprocess_env
from trainer import handover
from trainer.config import InputConfig
from trainer.features import compute_stats, infer_feature_kinds
from trainer.heads import CLASSIFICATION, REGRESSION, Head
from trainer import holdout
from trainer.inputs import (MARKED, _handed_over_columns, column_batches, count_picked, count_rows, eval_dataset,
                            handed_over_batches, handed_over_dataset, load_in_memory, make_dataset, parsed_batches,
                            parsed_columns)

FRACTION = 0.3


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    """A CSV of 30k rows through the Arrow ExampleGen in blocks of 64 KiB (about 20), cut 2:1."""
    folder = tmp_path_factory.mktemp("handover")
    (folder / "in").mkdir()
    (folder / "in" / "rows.csv").write_text(mixed_csv(30_000, 7), encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(csv_records, "read_batches", partial(csv_records.read_batches, block_bytes=1 << 16))
        examples = run_csv_example_gen(folder / "in", folder / "examples")
    examples.split_names = artifact_utils.encode_split_names(["train", "eval"])
    return examples


def _kinds(examples) -> dict[str, str]:
    # "nothing" has no value in any row, so the records do not hold it: a schema could still name
    # it, or a column of numbers none of these records holds ("unheld")
    return {**infer_feature_kinds(split_pattern(examples, TRAIN_SPLIT)), "nothing": "string", "unheld": "int64"}


def _folders(examples) -> list[str]:
    """Where the Trainer looks for the columns (components/trainer.py)."""
    return [columns_dir(examples.uri, TRAIN_SPLIT), columns_dir(examples.uri, EVAL_SPLIT)]


def _load(examples, handed_over: bool, caplog):
    """load_in_memory of the train split with the hold-out marks, given where the columns are
    handed over or not; and whether it took them."""
    with caplog.at_level(logging.INFO, logger="loopline"):
        caplog.clear()
        pattern, kinds = split_pattern(examples, TRAIN_SPLIT), _kinds(examples)
        path = handover.columns_file(_folders(examples), pattern, kinds, buckets=True) if handed_over else None
        columns = load_in_memory(pattern, kinds, InputConfig(), 32, held_out=FRACTION, columns_file=path)
    return columns, "handed over as columns" in caplog.text


def _assert_same(ours: dict, theirs: dict) -> None:
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        a, b = ours[name].numpy(), theirs[name].numpy()
        assert a.dtype == b.dtype and a.shape == b.shape, name
        if a.dtype.kind == "f":
            np.testing.assert_array_equal(a, b, err_msg=name)  # NaN where NaN, infinity where infinity
        else:
            assert (a == b).all(), name


def test_the_columns_handed_over_are_the_parsed_records(examples, caplog):
    path = handover.columns_file(_folders(examples), split_pattern(examples, TRAIN_SPLIT), _kinds(examples), buckets=True)
    assert path.startswith(columns_dir(examples.uri, TRAIN_SPLIT))
    assert len(list(handover.read_blocks(path))) > 10  # the blocks' order is kept across blocks
    (handed, taken), (parsed, parse_taken) = _load(examples, True, caplog), _load(examples, False, caplog)
    assert taken and not parse_taken
    _assert_same(handed, parsed)
    rows = parsed[MARKED].shape[0]
    assert rows > 15_000 and 0.2 < parsed[MARKED].numpy().mean() < 0.4  # the hold-out marks compared above
    assert np.isnan(parsed["ratio"].numpy()).any() and np.isinf(parsed["ratio"].numpy()).any()
    assert (parsed["city"].numpy() == b"").any() and (parsed["city"].numpy() == "Zürich".encode()).any()
    assert len(np.unique(parsed["code"].numpy())) > 1000  # text of many values
    assert (parsed["nothing"].numpy() == b"").all() and np.isnan(parsed["unheld"].numpy()).all()


def test_statistics_of_the_held_columns_are_those_of_the_parsed_records(examples, caplog):
    """The Trainer's statistics over the columns it holds (tensors, text counted by TensorFlow, in
    batches of any size) are those of a pass over the parsed records (NumPy, text counted by Counter)."""
    kinds = {name: kind for name, kind in _kinds(examples).items()}
    columns, _ = _load(examples, True, caplog)
    columns = {name: column for name, column in columns.items() if name != MARKED}
    want = compute_stats(parsed_batches(split_pattern(examples, TRAIN_SPLIT), kinds), kinds, classes=["city", "count"])
    assert want.strings["city"] and len(want.lookups["code"]) > 1000 and want.missing["city"] > 0
    assert sorted(want.classes["count"]) == sorted(str(n) for n in range(-5, 50))  # numbers as classes too
    for rows in (7_000, 1 << 16):
        got = compute_stats(column_batches(columns, rows), kinds, classes=["city", "count"])
        assert isinstance(next(column_batches(columns, rows))["city"], tf.Tensor)
        assert (got.strings, got.lookups, got.missing, got.count, got.classes) == \
            (want.strings, want.lookups, want.missing, want.count, want.classes)
        assert got.numbers.keys() == want.numbers.keys()
        for name, (mean, std) in want.numbers.items():  # float sums in another order
            assert got.numbers[name] == pytest.approx((mean, std), rel=1e-9), name


def test_the_in_memory_size_is_counted_as_for_the_parsed_records(examples):
    """Which way a split goes (held in memory or streamed) does not depend on the hand-over."""
    kinds = _kinds(examples)
    path = handover.columns_file(_folders(examples), split_pattern(examples, TRAIN_SPLIT), kinds)
    counted = sum(handover.in_memory_bytes(batch, kinds) for batch in handover.read_blocks(path))
    parsed = parsed_columns(split_pattern(examples, TRAIN_SPLIT), kinds, 2**40)
    assert counted == sum(int(tf.reduce_sum(tf.strings.length(c))) + 16 * int(tf.size(c)) if c.dtype == tf.string
                          else c.dtype.size * int(tf.size(c)) for c in parsed.values())
    assert parsed_columns(split_pattern(examples, TRAIN_SPLIT), kinds, counted - 1) is None
    for limit, fits in ((counted - 1, False), (counted, True)):
        assert (_handed_over_columns(path, kinds, limit, None) is not None) == fits


def test_columns_are_not_taken_for_another_file(examples, tmp_path, caplog):
    """A split file written again since (here without its last record) is parsed."""
    copy = type(examples)()
    copy.uri = str(tmp_path / "copy")
    copy.split_names = examples.split_names
    shutil.copytree(examples.uri, copy.uri)
    [path] = tf.io.gfile.glob(split_pattern(copy, TRAIN_SPLIT))
    records = list(tf.data.TFRecordDataset(path, "GZIP").as_numpy_iterator())
    with tf.io.TFRecordWriter(path, "GZIP") as writer:
        for record in records[:-1]:
            writer.write(record)
    columns, taken = _load(copy, True, caplog)
    assert not taken and columns[MARKED].shape[0] == len(records) - 1
    assert "no columns handed over" in caplog.text


def test_columns_of_other_types_than_the_kinds_are_left_to_the_parse(examples):
    kinds = {**_kinds(examples), "city": "float32"}
    assert handover.columns_file(_folders(examples), split_pattern(examples, TRAIN_SPLIT), kinds) is None
    with pytest.raises(tf.errors.InvalidArgumentError):
        parsed_columns(split_pattern(examples, TRAIN_SPLIT), kinds, 2**40)


def test_a_split_of_several_files_is_parsed(examples, tmp_path):
    folder = tmp_path / "Split-train"
    folder.mkdir()
    [path] = tf.io.gfile.glob(split_pattern(examples, TRAIN_SPLIT))
    shutil.copy(path, folder / "a.gz")
    shutil.copy(path, folder / "b.gz")
    assert handover.columns_file(_folders(examples), str(folder / "*"), _kinds(examples)) is None


def _eval_heads() -> list[Head]:
    return [Head("city", CLASSIFICATION, vocabulary=["Kraków", "Oslo", "Zürich"]),
            Head("count", REGRESSION, mean=20.0, std=15.0, label_dtype="float32")]


def _batches(dataset) -> list:
    return [tf.nest.map_structure(lambda t: t.numpy(), element) for element in dataset]


def test_the_eval_split_is_read_from_its_columns_as_from_its_records(examples, caplog):
    """The eval split's columns are handed over too (without hold-out buckets): the Trainer's
    evaluation reads them instead of parsing the records, the same batches in the same order."""
    kinds, heads, pattern = _kinds(examples), _eval_heads(), split_pattern(examples, EVAL_SPLIT)
    path = handover.columns_file(_folders(examples), pattern, kinds)
    assert path.startswith(columns_dir(examples.uri, EVAL_SPLIT)) and len(list(handover.read_blocks(path))) > 5
    assert handover.columns_file(_folders(examples), pattern, kinds, buckets=True) is None  # no hold-out buckets
    with caplog.at_level(logging.INFO, logger="loopline"):
        handed = eval_dataset(pattern, kinds, heads, 1000, InputConfig(), _folders(examples))
    assert "its columns handed over" in caplog.text
    parsed = make_dataset(pattern, kinds, heads, 1000, InputConfig())
    assert handed.element_spec == parsed.element_spec  # an evaluation traced for one takes the other
    ours, theirs = _batches(handed), _batches(parsed)
    assert len(ours) == len(theirs) > 5 and [len(t["city"]) for _, t in ours][:-1] == [1000] * (len(ours) - 1)
    for (features, targets), (want_features, want_targets) in zip(ours, theirs):
        for name in want_features:
            np.testing.assert_array_equal(features[name], want_features[name], err_msg=name)
        for name in want_targets:
            np.testing.assert_array_equal(targets[name], want_targets[name], err_msg=name)
    assert len(_batches(handed)) == len(ours)  # read again from the start at each pass


def test_an_eval_split_without_its_columns_is_parsed(examples, tmp_path, caplog):
    """No folders given, or a split file changed since: the records are parsed."""
    kinds, heads, pattern = _kinds(examples), _eval_heads(), split_pattern(examples, EVAL_SPLIT)
    with caplog.at_level(logging.INFO, logger="loopline"):
        eval_dataset(pattern, kinds, heads, 1000, InputConfig(), ())
        [path] = tf.io.gfile.glob(pattern)
        changed = tmp_path / "Split-eval" / "data.gz"
        changed.parent.mkdir()
        with tf.io.TFRecordWriter(str(changed), "GZIP") as writer:
            for record in list(tf.data.TFRecordDataset(path, "GZIP").as_numpy_iterator())[1:]:
                writer.write(record)
        rows = sum(len(t["city"]) for _, t in eval_dataset(str(changed.parent / "*"), kinds, heads, 1000, InputConfig(),
                                                              _folders(examples)))
    assert "its columns handed over" not in caplog.text and "no columns handed over" in caplog.text
    assert rows == sum(len(t["city"]) for _, t in make_dataset(pattern, kinds, heads, 1000)) - 1


def test_a_streamed_split_is_counted_summarized_and_validated_from_its_columns(examples):
    """A train split too big to hold: its held-out rows counted, its training rows' statistics and
    its validation rows' batches come from the handed-over columns as from its records."""
    kinds, heads, pattern = _kinds(examples), _eval_heads(), split_pattern(examples, TRAIN_SPLIT)
    path = handover.columns_file(_folders(examples), pattern, kinds, buckets=True)
    held = partial(holdout.held_out_buckets, fraction=FRACTION)
    assert count_picked(path, held) == count_rows(pattern, partial(holdout.validation_rows, fraction=FRACTION)) > 5000
    kept = compute_stats(handed_over_batches(path, kinds, lambda buckets: tf.logical_not(held(buckets))), kinds,
                         classes=["city"])
    want = compute_stats(parsed_batches(pattern, kinds, rows=partial(holdout.training_rows, fraction=FRACTION)), kinds,
                         classes=["city"])
    assert (kept.count, kept.strings, kept.lookups, kept.missing, kept.classes) == \
        (want.count, want.strings, want.lookups, want.missing, want.classes)
    assert kept.count == count_rows(pattern, lambda records: records) - count_picked(path, held)
    for name, moments in want.numbers.items():
        assert kept.numbers[name] == pytest.approx(moments, rel=1e-9), name
    ours = _batches(handed_over_dataset(path, kinds, heads, 1000, InputConfig(), pick=held))
    theirs = _batches(make_dataset(pattern, kinds, heads, 1000, InputConfig(),
                                   rows=partial(holdout.validation_rows, fraction=FRACTION)))
    assert len(ours) == len(theirs) > 5
    for (features, targets), (want_features, want_targets) in zip(ours, theirs):
        for name in want_features:
            np.testing.assert_array_equal(features[name], want_features[name], err_msg=name)
        for name in want_targets:
            np.testing.assert_array_equal(targets[name], want_targets[name], err_msg=name)


@pytest.mark.parametrize("in_memory_mb", [512, 1], ids=["held", "streamed"])
def test_a_trainer_given_the_columns_trains_and_evaluates_as_on_the_records(examples, caplog, in_memory_mb):
    """The same seeded, deterministic training run with and without the handed-over columns: the
    same weights and the same final metrics, the split held in memory or streamed."""
    from trainer.config import TrainerConfig
    from trainer.loop import train

    config = TrainerConfig(epochs=1, max_steps=8, seed=3, deterministic=True, batch_size=256, steps_per_loop=4,
                           tensorboard=False)
    config = config.model_copy(update={"input": config.input.model_copy(update={"in_memory_mb": in_memory_mb})})
    patterns = split_pattern(examples, TRAIN_SPLIT), split_pattern(examples, EVAL_SPLIT)
    with caplog.at_level(logging.INFO, logger="loopline"):
        caplog.clear()
        handed = train(config, *patterns, "city", kinds=_kinds(examples), columns_dirs=_folders(examples))
        log = caplog.text
    parsed = train(config, *patterns, "city", kinds=_kinds(examples))
    assert "eval split" in log and "its columns handed over" in log
    assert ("handed over as columns and held in memory" in log) == (in_memory_mb == 512)
    assert ("statistics, hold-out count and validation rows from the columns handed over" in log) == (in_memory_mb == 1)
    assert handed.metrics == parsed.metrics and handed.metrics["city_examples"] > 5000
    for ours, theirs in zip(handed.model.get_weights(), parsed.model.get_weights()):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("in_memory_mb", [512, 1], ids=["held", "streamed"])
def test_the_columns_train_as_the_records_across_two_replicas(examples, tmp_path, in_memory_mb):
    """Under MirroredStrategy (two logical CPUs, a process of its own) the handed-over columns'
    datasets are distributed as the records' are: the same weights and final metrics."""
    out = tmp_path / "runs.npz"
    args = [sys.executable, "-m", "tests.handover_worker", split_pattern(examples, TRAIN_SPLIT),
            split_pattern(examples, EVAL_SPLIT), "city", json.dumps(_kinds(examples)), json.dumps(_folders(examples)),
            str(in_memory_mb), str(out)]
    done = subprocess.run(args, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "its columns handed over" in done.stderr
    assert ("validation rows from the columns handed over" in done.stderr) == (in_memory_mb == 1)
    runs = np.load(out)
    handed, parsed = json.loads(str(runs["metrics"]))
    assert int(runs["replicas"]) == 2
    assert handed == parsed and handed["city_examples"] > 5000
    weights = [runs[f"arr_{i}"] for i in range(len(runs.files) - 2)]
    half = len(weights) // 2
    assert half > 0
    for ours, theirs in zip(weights[:half], weights[half:]):
        np.testing.assert_array_equal(ours, theirs)
