"""A split read once, in order, without a tf.data element per record: the same records, the same
parsed columns and the same checks as the tf.data read, or no answer where that read's order differs."""
from __future__ import annotations

import gzip
from functools import partial

import numpy as np
import pytest
import tensorflow as tf

import trainer.inputs as inputs
from tests.trainer_data import write_examples
from trainer import holdout
from trainer.features import infer_feature_kinds


def _split(path, rows: int = 50):
    rng = np.random.default_rng(0)
    return write_examples(path, {"x": rng.normal(size=rows), "y": rng.normal(size=rows),
                                 "kind": np.array([["a", "b", "c"][i % 3] for i in range(rows)])})


def test_chunks_hold_the_records_in_the_tf_data_order(tmp_path):
    path = _split(tmp_path / "train.gz")
    expected = [r.numpy() for r in inputs.record_dataset(path)]
    chunks = list(inputs.record_chunks(path, 16))
    assert [len(c) for c in chunks] == [16, 16, 16, 2]
    assert [r for c in chunks for r in c] == expected


def test_several_files_are_left_to_tf_data_and_none_is_an_error(tmp_path):
    _split(tmp_path / "a.gz"), _split(tmp_path / "b.gz")
    assert inputs.record_chunks(str(tmp_path / "*.gz"), 16) is None  # record_dataset interleaves them
    with pytest.raises(FileNotFoundError, match="no TFRecord files match"):
        inputs.record_chunks(str(tmp_path / "missing-*"), 16)


def test_without_the_record_reader_the_read_is_tf_data(tmp_path, monkeypatch):
    path = _split(tmp_path / "train.gz")
    monkeypatch.delattr(tf.compat.v1.io, "tf_record_iterator")
    assert inputs.record_chunks(path, 16) is None
    kinds = infer_feature_kinds(path)
    assert int(tf.shape(inputs.parsed_columns(path, kinds, 2**30)["x"])[0]) == 50


def test_a_corrupt_record_is_refused_as_tf_data_refuses_it(tmp_path):
    path = _split(tmp_path / "train.gz")
    raw = bytearray(gzip.decompress(open(path, "rb").read()))
    raw[len(raw) // 2] ^= 0xFF  # a byte inside a record: its CRC no longer matches
    with gzip.open(tmp_path / "bad.gz", "wb") as f:
        f.write(bytes(raw))
    with pytest.raises(tf.errors.DataLossError):
        list(inputs.record_chunks(str(tmp_path / "bad.gz"), 16))
    with pytest.raises(tf.errors.DataLossError):
        list(inputs.record_dataset(str(tmp_path / "bad.gz")))


def test_parsed_columns_are_those_of_the_tf_data_read(tmp_path, monkeypatch):
    path = _split(tmp_path / "train.gz", rows=40)
    kinds = infer_feature_kinds(path)
    mark = partial(holdout.held_out, fraction=0.3)
    read = inputs.parsed_columns(path, kinds, 2**30, mark=mark)
    with monkeypatch.context() as patch:
        patch.setattr(inputs, "record_chunks", lambda *args: None)  # the tf.data read
        reference = inputs.parsed_columns(path, kinds, 2**30, mark=mark)
    assert read.keys() == reference.keys() and inputs.MARKED in read
    for name, column in reference.items():
        assert read[name].dtype == column.dtype and read[name].shape == column.shape
        assert np.array_equal(read[name].numpy(), column.numpy()), name
    assert 0 < int(tf.reduce_sum(tf.cast(read[inputs.MARKED], tf.int32))) < 40
    assert inputs.parsed_columns(path, kinds, 100, mark=mark) is None  # over max_bytes, as before
