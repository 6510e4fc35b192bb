"""ingestion/csv_records.py writes tf.Examples in protobuf's wire format itself: byte for byte what
tfx-bsl's encoder gives after protobuf's deterministic serialization (the bytes the stock split
hashes), and TFRecord frames and split buckets by the stock rules."""
from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf

from ingestion import csv_records
from tfx_bsl.coders.csv_decoder import ColumnType

T = ColumnType


def _reference(batch: pa.RecordBatch, types: dict[str, ColumnType]) -> list[bytes]:
    """tfx-bsl's C++ encoder on one-value lists, then protobuf's deterministic serialization."""
    from tfx_bsl.coders import example_coder

    columns = []
    for name in batch.schema.names:
        cells = batch.column(name)
        if types[name] == T.UNKNOWN:
            columns.append(pa.nulls(len(cells), pa.large_list(pa.large_binary())))
            continue
        offsets = np.concatenate([[0], np.cumsum(np.asarray(cells.is_valid(), np.int64))])
        columns.append(pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), csv_records._values(cells.drop_null(), types[name])))
    encoded = example_coder.RecordBatchToExamplesEncoder().encode(pa.RecordBatch.from_arrays(columns, names=batch.schema.names))
    return [tf.train.Example.FromString(r).SerializeToString(deterministic=True) for r in encoded]


def _batch(columns: dict[str, list]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({n: pa.array(v, pa.large_string()) for n, v in columns.items()})


def _varied_batch() -> tuple[pa.RecordBatch, dict[str, ColumnType]]:
    rng = np.random.default_rng(0)
    rows = 500
    ints = rng.choice([0, 1, -1, 127, 128, 16383, 16384, 2**31, -2**63, 2**63 - 1, 300], rows).astype(object)
    columns = {
        "zeta": [str(v) if i % 7 else None for i, v in enumerate(ints)],  # missing cells too
        "Alpha": [f"{v:.3f}" for v in rng.normal(0, 1e3, rows)],
        "ratio": ["nan", "-inf", "inf", "1e-40", "-0.0"] * (rows // 5),
        "note": ["x" * int(n) if n else None for n in rng.integers(0, 300, rows)],  # lengths past 127: 2-byte varints
        "é_unicode": ["Ünïcødé"] * rows,
        "empty": [None] * rows,
        "_": ["+5", "5", " 7", "1_0", "-3"] * (rows // 5),  # Python-only int spellings
    }
    types = {"zeta": T.INT, "Alpha": T.FLOAT, "ratio": T.FLOAT, "note": T.STRING, "é_unicode": T.STRING, "empty": T.UNKNOWN, "_": T.INT}
    return _batch(columns), types


def test_examples_are_protobufs_deterministic_bytes():
    batch, types = _varied_batch()
    assert {n: csv_records.column_type(batch.column(n)) for n in batch.schema.names} == types
    ours = csv_records.encode(batch, types).to_pylist()
    assert ours == _reference(batch, types)
    parsed = tf.train.Example.FromString(ours[1])
    assert parsed.features.feature["zeta"].int64_list.value == [int(batch.column("zeta")[1].as_py())]
    assert parsed.features.feature["note"].WhichOneof("kind") == "bytes_list"
    assert parsed.features.feature["empty"].WhichOneof("kind") is None


def test_the_columns_beside_the_examples_are_what_the_decoder_reads_from_them():
    """What the ExampleGen computes statistics from: tfx-bsl's decoding of the same examples,
    column for column (types, lists, values to the bit), so the statistics are the same too."""
    from tfx_bsl.coders import example_coder

    from validation.statistics import summarize_batch, to_statistics

    batch, types = _varied_batch()
    records, columns = csv_records.encode_with_columns(batch, types)
    assert records.to_pylist() == csv_records.encode(batch, types).to_pylist()
    decoded = example_coder.ExamplesToRecordBatchDecoder().DecodeBatch(records.to_pylist())
    assert sorted(columns.schema.names) == sorted(decoded.schema.names)
    for name in columns.schema.names:
        ours, theirs = columns.column(name), decoded.column(decoded.schema.get_field_index(name))
        assert ours.type == theirs.type, name
        if ours.type == pa.null():
            continue
        assert ours.value_lengths().to_pylist() == theirs.value_lengths().to_pylist(), name
        flat_ours, flat_theirs = ours.flatten(), theirs.flatten()
        if pa.types.is_floating(ours.type.value_type):  # NaN too, bit for bit
            assert np.array_equal(np.asarray(flat_ours).view(np.uint32), np.asarray(flat_theirs).view(np.uint32)), name
        else:
            assert flat_ours.to_pylist() == flat_theirs.to_pylist(), name
    assert to_statistics("x", *summarize_batch(columns)) == to_statistics("x", *summarize_batch(decoded))


def test_a_batch_with_all_cells_empty_and_an_empty_batch():
    batch = _batch({"a": [None, None], "b": ["1", None]})
    types = {"a": T.STRING, "b": T.INT}
    assert csv_records.encode(batch, types).to_pylist() == _reference(batch, types)
    assert csv_records.encode(batch.slice(0, 0), types).to_pylist() == []


@pytest.mark.parametrize("buckets", [[2, 3], [1, 5, 9], None])
def test_split_frames_follow_the_stock_rules(tmp_path, buckets):
    records = [f"record {i}".encode() * (i % 40) for i in range(300)]
    frames = csv_records.split_frames(pa.array(records, pa.large_binary()), buckets)
    expected: list[list[bytes]] = [[] for _ in (buckets or [0])]
    for record in records:  # the stock ExampleGen's rule, in Python ints
        bucket = int(hashlib.sha256(record).hexdigest(), 16) % buckets[-1] if buckets else 0
        expected[sum(bucket >= end for end in buckets) if buckets else 0].append(record)
    assert len(frames) == len(expected)
    for i, (framed, want) in enumerate(zip(frames, expected)):
        path = tmp_path / f"split{i}.tfrecord"
        path.write_bytes(framed)
        # TensorFlow's reader checks every length and CRC.
        assert list(tf.data.TFRecordDataset(str(path)).as_numpy_iterator()) == want
    assert sum(map(len, expected)) == len(records) and (buckets is None or all(expected))
