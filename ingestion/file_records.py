"""Parquet files and image folders to serialized tf.Examples (no TFX here; the component is
components/file_example_gen.py). Files are opened through Beam's filesystems, so every scheme
Beam knows works.

- Parquet: each column becomes a feature; integers and booleans INT, floating point FLOAT,
  strings and binary BYTES; a list column keeps its lists (a variable-length feature), a null
  cell is a value-less feature. Read a row group at a time and encoded by tfx-bsl's C++ encoder.
- Image folder: `<folder>/<class>/<file>`; one example per file with the encoded bytes in
  feature `image` and the class folder's name in feature `label`. Files that are not PNG, JPEG,
  GIF or BMP (by their first bytes) are an error naming the file.
"""
from __future__ import annotations

import posixpath
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from tensorflow.core.example import example_pb2
from tfx_bsl.coders import example_coder

from ingestion.images import looks_like_image

IMAGE_FEATURE = "image"
LABEL_FEATURE = "label"


class FormatError(ValueError):
    """A file that cannot be read as its data.format says; names the file and the column."""


def _item_type(name: str, path: str, arrow_type: pa.DataType) -> pa.DataType:
    if pa.types.is_integer(arrow_type) or pa.types.is_boolean(arrow_type):
        return pa.int64()
    if pa.types.is_floating(arrow_type) or pa.types.is_decimal(arrow_type):
        return pa.float32()
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_binary(arrow_type) \
            or pa.types.is_large_binary(arrow_type):
        return pa.large_binary()
    raise FormatError(f"{path}: column '{name}' has type {arrow_type}; expected numbers, strings or lists of them")


def _feature_column(name: str, path: str, column: pa.Array) -> pa.Array:
    """One value list per row (a scalar cell: a list of one; a null cell: a value-less feature)."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        item = _item_type(name, path, column.type.value_type)  # a nested list is an error naming the column
        return column.cast(pa.large_list(item))
    item = _item_type(name, path, column.type)
    valid = np.asarray(column.is_valid(), dtype=np.int64) if column.null_count else np.ones(len(column), np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(valid)]), pa.int64())
    values = column.drop_null().cast(item) if item != pa.float32() else column.drop_null().cast(pa.float64()).cast(
        pa.float32(), safe=False)
    lists = pa.LargeListArray.from_arrays(offsets, values)
    # Rows with a null cell get a null list (value-less feature), as the CSV reader writes them.
    return pa.LargeListArray.from_arrays(offsets, values, mask=pa.array(~np.asarray(valid, bool))) \
        if column.null_count else lists


def _serialized(batch: pa.RecordBatch) -> list[bytes]:
    """Deterministic serialization: the same row gives the same bytes (the split hashes them)."""
    records = example_coder.RecordBatchToExamplesEncoder().encode(batch)
    parse = example_pb2.Example.FromString
    return [parse(r).SerializeToString(deterministic=True) for r in records]


def parquet_records(path: str) -> Iterator[list[bytes]]:
    """The file's rows as serialized tf.Examples, a row group at a time."""
    with FileSystems.open(path) as f:
        reader = pq.ParquetFile(f)
        for group in range(reader.num_row_groups):
            table = reader.read_row_group(group)
            columns = [_feature_column(n, path, c.combine_chunks()) for n, c in zip(table.column_names, table.columns)]
            if table.num_rows:
                yield _serialized(pa.RecordBatch.from_arrays(columns, names=table.column_names))


def image_record(path: str) -> list[bytes]:
    """One example of `<class>/<file>`: the file's bytes in `image`, `<class>` in `label`."""
    with FileSystems.open(path) as f:
        content = f.read()
    if not looks_like_image(content):
        raise FormatError(f"{path}: not a PNG, JPEG, GIF or BMP image (data.format image_folder)")
    label = posixpath.basename(posixpath.dirname(path.replace("\\", "/")))
    example = example_pb2.Example()
    example.features.feature[IMAGE_FEATURE].bytes_list.value.append(content)
    example.features.feature[LABEL_FEATURE].bytes_list.value.append(label.encode())
    return [example.SerializeToString(deterministic=True)]


def image_records(path: str) -> Iterator[list[bytes]]:
    yield image_record(path)


def image_folder_splits(path: str, out_dir: str, eval_path: str | None = None) -> tuple[str, str]:
    """`loopline train`'s own read of an image folder (`<path>/<class>/<file>`): GZIP TFRecords
    `<out_dir>/{train,eval}/data.tfrecord.gz` of the ExampleGen's examples, cut 2:1 by its
    hash-bucket rule (the pipeline's split), or `eval_path`'s folder as the eval split. Returns
    the two file patterns."""
    import tensorflow as tf

    from ingestion.csv_records import split_frames

    sources = [(path, [2, 3])] if eval_path is None else [(path, None), (eval_path, None)]
    paths = {split: posixpath.join(out_dir, split, "data.tfrecord.gz") for split in ("train", "eval")}
    for file in paths.values():
        tf.io.gfile.makedirs(posixpath.dirname(file))
    writers = {split: tf.io.TFRecordWriter(file, options="GZIP") for split, file in paths.items()}
    try:
        for index, (folder, buckets) in enumerate(sources):
            files = sorted(tf.io.gfile.glob(posixpath.join(folder, "*", "*")))
            if not files:
                raise FormatError(f"{folder}: no <class>/<image> files (data.format image_folder)")
            for file in files:
                for record in image_record(file):
                    # One split per record: the first of split_frames' outputs that holds it.
                    frames = split_frames(pa.array([record], pa.large_binary()), buckets)
                    split = ("train", "eval")[index if buckets is None else next(i for i, f in enumerate(frames) if f)]
                    writers[split].write(record)
    finally:
        for writer in writers.values():
            writer.close()
    return paths["train"], paths["eval"]
