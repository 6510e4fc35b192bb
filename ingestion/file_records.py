"""Parquet files, TFRecord files and image folders to serialized tf.Examples (no TFX here; the component is
components/file_example_gen.py). Files are opened through Beam's filesystems, so every scheme
Beam knows works.

- Parquet: each column becomes a feature; integers and booleans INT, floating point FLOAT,
  strings and binary BYTES; a list column keeps its lists (a variable-length feature), a null
  cell is a value-less feature. Read a row group at a time and encoded by tfx-bsl's C++ encoder.
- Image folder: `<folder>/<class>/<file>`; one example per file with the encoded bytes in
  feature `image` and the class folder's name in feature `label`. A file that is not a PNG, JPEG,
  GIF or BMP (by its first bytes), declares more than MAX_IMAGE_PIXELS or does not decode is an
  error naming the file.
- TFRecord: each record's frame (length, data, CRC32Cs) is checked and the data parsed as a
  tf.Example, then split as TFX's ImportExampleGen splits it; a cut or damaged frame, bytes that
  are no tf.Example, or a feature whose kind changes within the file are an error naming the
  record.
"""
from __future__ import annotations

import posixpath
import struct
import zlib
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from google.protobuf.message import DecodeError
from tensorflow.core.example import example_pb2
from tfx_bsl.coders import example_coder

from ingestion.images import looks_like_image, size_problem
from ingestion.op_errors import op_message

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


def open_parquet(path: str, f) -> pq.ParquetFile:
    """The Parquet file open at `f`; a file that is not Parquet is an error naming it."""
    try:
        return pq.ParquetFile(f)
    except (pa.ArrowInvalid, OSError) as exc:
        raise FormatError(f"{path}: not a readable Parquet file ({' '.join(str(exc).split())})") from None


def parquet_records(path: str) -> Iterator[list[bytes]]:
    """The file's rows as serialized tf.Examples, a row group at a time."""
    with FileSystems.open(path) as f:
        reader = open_parquet(path, f)
        for group in range(reader.num_row_groups):
            table = reader.read_row_group(group)
            columns = [_feature_column(n, path, c.combine_chunks()) for n, c in zip(table.column_names, table.columns)]
            if table.num_rows:
                yield _serialized(pa.RecordBatch.from_arrays(columns, names=table.column_names))


def _image_problem(content: bytes) -> str | None:
    """Why a file's bytes are no image to train on; None when they decode. The declared size is
    checked before decoding, so a decompression bomb never allocates its pixels."""
    import tensorflow as tf

    if not looks_like_image(content):
        return "not a PNG, JPEG, GIF or BMP image"
    problem = size_problem(content)
    if problem is not None:
        return f"not an image to read: {problem}"
    try:
        tf.io.decode_image(content, expand_animations=False)
    except (tf.errors.InvalidArgumentError, tf.errors.ResourceExhaustedError) as exc:
        return f"not a readable image: {op_message(exc)}"
    return None


def image_record(path: str) -> list[bytes]:
    """One example of `<class>/<file>`: the file's bytes in `image`, `<class>` in `label`; a file
    that does not decode as an image is an error naming it."""
    with FileSystems.open(path) as f:
        content = f.read()
    problem = _image_problem(content)
    if problem is not None:
        raise FormatError(f"{path}: {problem} (data.format image_folder)")
    label = posixpath.basename(posixpath.dirname(path.replace("\\", "/")))
    example = example_pb2.Example()
    example.features.feature[IMAGE_FEATURE].bytes_list.value.append(content)
    example.features.feature[LABEL_FEATURE].bytes_list.value.append(label.encode())
    return [example.SerializeToString(deterministic=True)]


def _unmasked_crc(masked: int) -> int:
    """TFRecord's CRC as stored (masked: rotated and offset), back to the plain CRC32C."""
    rotated = (masked - 0xA282EAD8) & 0xFFFFFFFF
    return ((rotated >> 17) | (rotated << 15)) & 0xFFFFFFFF


def _tfrecord_frames(path: str) -> Iterator[tuple[int, bytes]]:
    """Each record's data and number (from 1), CRCs checked; a frame that is cut or damaged is an
    error naming the record. Beam opens the file, so a `.gz` file is read as GZIP (as Beam's own
    TFRecord reader does)."""
    import google_crc32c

    number = 0
    with FileSystems.open(path) as f:
        try:
            while header := f.read(12):
                number += 1
                where = f"{path}: record {number}"
                if len(header) < 12:
                    raise FormatError(f"{where}: the file ends inside the record's length (a cut file?)")
                length, length_crc = struct.unpack("<QI", header)
                if google_crc32c.value(header[:8]) != _unmasked_crc(length_crc):
                    raise FormatError(f"{where}: the length's CRC does not match (not a TFRecord file, or damaged)")
                data = f.read(length + 4)
                if len(data) < length + 4:
                    raise FormatError(f"{where}: the file ends inside the record ({len(data)} of {length + 4} bytes; "
                                      "a cut file?)")
                if google_crc32c.value(data[:length]) != _unmasked_crc(struct.unpack("<I", data[length:])[0]):
                    raise FormatError(f"{where}: the data's CRC does not match (damaged)")
                yield number, data[:length]
        except (zlib.error, EOFError) as exc:  # a .gz file whose compressed stream is cut or damaged
            raise FormatError(f"{path}: record {number + 1}: the GZIP stream is damaged or cut ({exc})") from None


_KINDS = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}


def _decoded_kinds(records: list[bytes]) -> dict[str, str] | None:
    """Each feature's kind of values in a batch, by tfx-bsl's C++ decoder (the one StatisticsGen
    uses); None when the batch's examples disagree on one."""
    try:
        batch = example_coder.ExamplesToRecordBatchDecoder().DecodeBatch(records)
    except RuntimeError:  # INVALID_ARGUMENT: Feature had wrong type
        return None
    kinds = {}
    for field in batch.schema:
        if not pa.types.is_null(field.type):  # no value in this batch
            item = field.type.value_type
            kinds[field.name] = "float" if pa.types.is_floating(item) else "int64" if pa.types.is_integer(item) else "bytes"
    return kinds


def _check_kinds(path: str, first: int, records: list[bytes], kinds: dict[str, str]) -> None:
    """A feature keeps one kind of values (bytes, float or int64) through a file: the readers after
    ExampleGen take a column of one type. `first`: the number of the batch's first record; `kinds`:
    the kinds seen so far, updated. Example by example only when the batch holds a disagreement,
    to name the record."""
    found = _decoded_kinds(records)
    if found is not None and all(kinds.get(name, kind) == kind for name, kind in found.items()):
        kinds.update(found)
        return
    for number, record in enumerate(records, first):
        for name, feature in example_pb2.Example.FromString(record).features.feature.items():
            kind = _KINDS.get(feature.WhichOneof("kind"))
            if kind is not None and kinds.setdefault(name, kind) != kind:
                raise FormatError(f"{path}: record {number}: feature '{name}' holds {kind} values, where the records "
                                  f"before it hold {kinds[name]}")


def tfrecord_records(path: str, batch_size: int = 4096) -> Iterator[list[bytes]]:
    """The file's tf.Examples in protobuf's deterministic serialization (the bytes TFX's
    ImportExampleGen hashes to split them), a batch at a time. A record whose frame is cut or
    damaged, that is not a tf.Example, or whose feature holds another kind of values than before in
    the file is an error naming the record (and the feature)."""
    batch: list[bytes] = []
    kinds: dict[str, str] = {}
    for number, data in _tfrecord_frames(path):
        try:
            example = example_pb2.Example.FromString(data)
        except DecodeError:
            raise FormatError(f"{path}: record {number}: {len(data)} bytes that are not a tf.Example") from None
        batch.append(example.SerializeToString(deterministic=True))
        if len(batch) == batch_size:
            _check_kinds(path, number - len(batch) + 1, batch, kinds)
            yield batch
            batch = []
    if batch:
        _check_kinds(path, number - len(batch) + 1, batch, kinds)
        yield batch


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
