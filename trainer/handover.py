"""Columns handed over with a split's records, so that the Trainer need not read and parse them back.

The CSV ExampleGen encodes each block of rows into tf.Examples from typed Arrow columns (a list
column of the example's value type per feature, tfx-bsl's decoder layout:
ingestion/csv_records.encode_with_columns). Beside each GZIP file of a split it writes those
columns (`ColumnsWriter`), in the records' order (the train split's with each record's hold-out
bucket, trainer.holdout.bucket of its serialized bytes), as an Arrow IPC stream named after the
finished GZIP file's CRC32C and size. The Trainer, holding the train split of one file in memory
or evaluating on the eval split, reads that file's CRC32C and size and takes the columns of that
name (`columns_file`); it parses the records otherwise (another ExampleGen, images, a file changed
or replaced since, several files). Both ways give the same tensors: the columns go through
parse_examples' own checks and conversion (features.checked_columns), and their hold-out marks
come from the same buckets.
"""
from __future__ import annotations

import logging
import os
import uuid
from typing import Iterator, Sequence

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


def columns_file(folders: Sequence[str], file_pattern: str, kinds: FeatureKinds, buckets: bool = False) -> str | None:
    """The columns handed over with the split's one file in one of `folders`, when they are there
    for its very bytes, hold the value types the parse reads and, with `buckets`, the records'
    hold-out buckets; else None (the records are to be parsed)."""
    folders = [folder for folder in folders if tf.io.gfile.isdir(folder)]
    if not folders or any(kind_spec(kind).is_image for kind in kinds.values()):
        return None
    files = tf.io.gfile.glob(file_pattern)
    if len(files) != 1:
        return None
    name = columns_name(*_crc32c_and_size(files[0]))
    path = next((p for p in (os.path.join(folder, name) for folder in folders) if tf.io.gfile.exists(p)), None)
    if path is None:
        log.info("no columns handed over for %s; parsing its records", files[0])
        return None
    with GFileStream(path, "rb") as file:
        schema = pa.ipc.open_stream(pa.PythonFile(file, mode="r")).schema
    if any(_values_type(schema, name) not in (*_ARROW_TYPES.get(value_dtype(kind), ()), pa.null())
           for name, kind in kinds.items()):
        return None  # not the types the parse reads: it raises its own error
    return path if not buckets or BUCKET in schema.names else None


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
    return column_tensors(block_arrays(columns, kinds), kinds)


def block_arrays(columns: pa.RecordBatch, kinds: FeatureKinds) -> dict[str, dict[str, np.ndarray]]:
    """A block's columns as NumPy arrays, for `column_tensors`: each column's row splits (int64, as
    tf.io.RaggedFeature parses them) and values, a text column's as indices into its distinct
    values (a Python object per distinct value, not per row). Shaped as `arrays_spec` says."""
    arrays = {}
    for name, kind in kinds.items():
        dtype = value_dtype(kind)
        text = dtype == tf.string
        if _values_type(columns.schema, name) == pa.null():  # no value in any row
            splits, values = np.zeros(columns.num_rows + 1, np.int64), pa.array([], _ARROW_TYPES[dtype][0])
        else:
            column = columns.column(name)
            offsets = column.offsets.to_numpy().astype(np.int64)
            splits, values = offsets - offsets[0], column.flatten()
        if text:
            encoded = pc.dictionary_encode(values)
            arrays[name] = {"splits": splits, "distinct": encoded.dictionary.to_numpy(zero_copy_only=False).astype(object),
                            "indices": encoded.indices.to_numpy(zero_copy_only=False)}
        else:
            arrays[name] = {"splits": splits, "values": values.to_numpy(zero_copy_only=False)}
    return arrays


def arrays_spec(kinds: FeatureKinds) -> dict[str, dict[str, tf.TensorSpec]]:
    """The structure of `block_arrays`' answers, as tensors."""
    def spec(kind: str) -> dict[str, tf.TensorSpec]:
        values = ({"distinct": tf.TensorSpec([None], tf.string), "indices": tf.TensorSpec([None], tf.int32)}
                  if value_dtype(kind) == tf.string else {"values": tf.TensorSpec([None], value_dtype(kind))})
        return {"splits": tf.TensorSpec([None], tf.int64), **values}

    return {name: spec(kind) for name, kind in kinds.items()}


def column_tensors(arrays: dict[str, dict], kinds: FeatureKinds) -> dict[str, tf.Tensor]:
    """parse_examples' dense tensors from `block_arrays`' answer (eagerly, or in a tf.data map),
    through its own checks and conversion."""
    ragged = {}
    for name, kind in kinds.items():
        column = arrays[name]
        values = (tf.gather(tf.convert_to_tensor(column["distinct"], tf.string), column["indices"]) if "distinct" in column
                  else tf.convert_to_tensor(column["values"], value_dtype(kind)))
        ragged[name] = tf.RaggedTensor.from_row_splits(values, column["splits"], validate=False)
    return checked_columns(ragged, kinds)


def buckets(columns: pa.RecordBatch) -> tf.Tensor:
    return tf.constant(columns.column(BUCKET).to_numpy().astype(np.int64))


def _values_type(schema: pa.Schema, name: str) -> pa.DataType:
    """The type of a column's values (null: a column with no value, or none at all)."""
    kind = schema.field(name).type if name in schema.names else pa.null()
    return pa.null() if pa.types.is_null(kind) else kind.value_type
