"""Columns handed over with a split's records, so that the Trainer need not read and parse them back.

The CSV ExampleGen encodes each block of rows into tf.Examples from typed Arrow columns (a list
column of the example's value type per feature, tfx-bsl's decoder layout:
ingestion/csv_records.encode_with_columns). Beside each GZIP file of the train split it writes
those columns (`ColumnsWriter`), in the records' order and with each record's hold-out bucket
(trainer.holdout.bucket of its serialized bytes), as an Arrow IPC stream named after the finished
GZIP file's CRC32C and size. The Trainer, holding a split of one file in memory, reads that file's
CRC32C and size and takes the columns of that name (`columns_file`); it parses the records
otherwise (another ExampleGen, images, a file changed or replaced since, several files). Both ways
give the same tensors: the columns go through parse_examples' own checks and conversion
(features.checked_columns), and their hold-out marks come from the same buckets.
"""
from __future__ import annotations

import logging
import os
import uuid
from typing import Iterator

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tensorflow as tf

from trainer.arrow_io import GFileStream
from trainer.features import FeatureKinds, checked_columns, kind_spec, value_dtype

COMPRESSION = "zstd"  # Arrow IPC's per-buffer compression: the offsets and repeated values shrink about 4x
BUCKET = "__holdout_bucket__"  # the records' trainer.holdout.bucket, beside the features
_ARROW_TYPES = {tf.float32: (pa.float32(),), tf.int64: (pa.int64(),), tf.string: (pa.binary(), pa.large_binary())}

log = logging.getLogger("loopline")


def columns_name(crc32c: int, size: int) -> str:
    """The name of the columns of a records file whose bytes have this CRC32C and size."""
    return f"{crc32c:08x}-{size}.arrow"


class ColumnsWriter:
    """Writes a records file's columns as its blocks are written, under a temporary name, and
    names them after the finished file (`close`)."""

    def __init__(self, folder: str):
        self._folder = folder
        self._path = os.path.join(folder, f".{uuid.uuid4().hex}.partial")
        self._file = None
        self._writer = None

    def write(self, columns: pa.RecordBatch) -> None:
        """One block's columns (with BUCKET), in the order its records were written."""
        columns = columns.cast(_compact(columns.schema))
        if self._writer is None:
            tf.io.gfile.makedirs(self._folder)
            self._file = pa.PythonFile(GFileStream(self._path, "wb"), mode="w")
            self._writer = pa.ipc.new_stream(self._file, columns.schema, options=pa.ipc.IpcWriteOptions(compression=COMPRESSION))
        self._writer.write_batch(columns)

    def close(self, crc32c: int, size: int) -> None:
        """The records file is finished with these bytes: the columns take its name."""
        if self._writer is None:
            return
        self._writer.close()
        self._file.close()
        tf.io.gfile.rename(self._path, os.path.join(self._folder, columns_name(crc32c, size)), overwrite=True)


def _compact(schema: pa.Schema) -> pa.Schema:
    """32-bit offsets for list and binary columns (a block is far under 2 GiB): half the offsets' bytes."""
    def compact(kind: pa.DataType) -> pa.DataType:
        if pa.types.is_large_list(kind):
            return pa.list_(compact(kind.value_type))
        return pa.binary() if pa.types.is_large_binary(kind) else kind

    return pa.schema([field.with_type(compact(field.type)) for field in schema])


def columns_file(folder: str, file_pattern: str, kinds: FeatureKinds) -> str | None:
    """The columns handed over with the split's one file, when they are there for its very bytes
    and hold the value types the parse reads; else None (the records are to be parsed)."""
    if not tf.io.gfile.isdir(folder) or any(kind_spec(kind).is_image for kind in kinds.values()):
        return None
    files = tf.io.gfile.glob(file_pattern)
    if len(files) != 1:
        return None
    path = os.path.join(folder, columns_name(*_crc32c_and_size(files[0])))
    if not tf.io.gfile.exists(path):
        log.info("no columns handed over for %s; parsing its records", files[0])
        return None
    with GFileStream(path, "rb") as file:
        schema = pa.ipc.open_stream(pa.PythonFile(file, mode="r")).schema
    if any(_values_type(schema, name) not in (*_ARROW_TYPES.get(value_dtype(kind), ()), pa.null())
           for name, kind in kinds.items()):
        return None  # not the types the parse reads: it raises its own error
    return path


def read_blocks(path: str) -> Iterator[pa.RecordBatch]:
    """The handed-over columns (`columns_file`), block by block."""
    with GFileStream(path, "rb") as file:
        yield from pa.ipc.open_stream(pa.PythonFile(file, mode="r"))


def _crc32c_and_size(path: str, piece: int = 8 << 20) -> tuple[int, int]:
    crc32c, size = 0, 0
    with tf.io.gfile.GFile(path, "rb") as f:
        while data := f.read(piece):
            crc32c, size = google_crc32c.extend(crc32c, data), size + len(data)
    return crc32c, size


def in_memory_bytes(columns: pa.RecordBatch, kinds: FeatureKinds) -> int:
    """What the columns take once converted (`to_columns`), counted as inputs.parsed_columns
    counts parsed ones: per value of the dense shape 4 bytes (float32), or 16 and its length (text)."""
    total = 0
    for name, kind in kinds.items():
        values = columns.num_rows * kind_spec(kind).size
        total += 4 * values if value_dtype(kind) != tf.string else 16 * values
        if value_dtype(kind) == tf.string and _values_type(columns.schema, name) != pa.null():
            total += pc.sum(pc.binary_length(columns.column(name).flatten())).as_py() or 0
    return total


def to_columns(columns: pa.RecordBatch, kinds: FeatureKinds) -> dict[str, tf.Tensor]:
    """parse_examples' dense tensors from handed-over columns, through its own checks."""
    return checked_columns({name: _ragged(columns, name, value_dtype(kind)) for name, kind in kinds.items()}, kinds)


def buckets(columns: pa.RecordBatch) -> tf.Tensor:
    return tf.constant(columns.column(BUCKET).to_numpy().astype(np.int64))


def _values_type(schema: pa.Schema, name: str) -> pa.DataType:
    """The type of a column's values (null: a column with no value, or none at all)."""
    kind = schema.field(name).type if name in schema.names else pa.null()
    return pa.null() if pa.types.is_null(kind) else kind.value_type


def _ragged(columns: pa.RecordBatch, name: str, dtype: tf.DType) -> tf.RaggedTensor:
    """One column's values per row, as tf.io.RaggedFeature parses them (int64 row splits)."""
    if _values_type(columns.schema, name) == pa.null():  # no value in any row
        return tf.RaggedTensor.from_row_splits(tf.zeros([0], dtype), tf.zeros([columns.num_rows + 1], tf.int64))
    column = columns.column(name)
    offsets = column.offsets.to_numpy().astype(np.int64)
    values = column.flatten()
    if dtype == tf.string:  # through a dictionary: a Python object per distinct value, not per row
        encoded = pc.dictionary_encode(values)
        distinct = tf.constant(encoded.dictionary.to_numpy(zero_copy_only=False).astype(object), tf.string)
        values = tf.gather(distinct, encoded.indices.to_numpy(zero_copy_only=False))
    else:
        values = tf.constant(values.to_numpy(zero_copy_only=False), dtype)
    return tf.RaggedTensor.from_row_splits(values, offsets - offsets[0], validate=False)
