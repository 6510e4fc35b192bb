"""CSV files to serialized tf.Examples a record batch at a time, with the stock CsvExampleGen's rules.

The stock component (tfx_bsl's csv_decoder) parses every line in Python. Here Arrow parses the
file in blocks and tfx-bsl's C++ encoder writes the tf.Examples, while the results stay those of
the stock component:
- a column is INT when every non-empty cell is an int64 to Python's `int(cell)`, else FLOAT when
  every one is a number to `float(cell)`, else STRING (ints beyond int64 make it STRING);
- an empty cell (quoted or not) is a missing value: an empty value list of the column's type; a
  column with no value at all gives value-less features;
- blank lines are skipped; a row with another number of cells than the header is an error.
Cells that Arrow's parsers and Python's read differently (blanks and underscores inside numbers,
`nan` spellings, `+`, hex) go through Python's own `int`/`float` on the cell's bytes.

Files are opened through Beam's filesystems, so every scheme Beam knows works (gs://, and the
tests' ram://).
"""
from __future__ import annotations

import bisect
import csv
import hashlib
import io
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from apache_beam.io.filesystems import FileSystems
from tensorflow.core.example import example_pb2
from tfx_bsl.coders import example_coder
from tfx_bsl.coders.csv_decoder import ColumnType

BLOCK_BYTES = 8 << 20  # Arrow parses this much of a file at a time: the memory per batch.
_INT64 = np.iinfo(np.int64)
_PLAIN_INT = r"^[+-]?[0-9]+$"  # Python's int() and Arrow's int64 parser agree on these (less the '+').
# Python reads these, Arrow does not (or reads them another way): whitespace and underscores in
# numbers, and NaN (Python keeps the sign of '-nan').
_PYTHON_ONLY = r"[\t\n\v\f\r _]|[nN][aA][nN]"


class CsvError(ValueError):
    """A CSV that cannot be read as the stock component would read it; says which file and why."""


def read_header(path: str) -> list[str]:
    """The column names in the file's first line (as the stock component reads them)."""
    with FileSystems.open(path) as f:
        first = f.readline().decode("utf-8")
    names = next(csv.reader([first]), [])
    if not names:
        raise CsvError(f"{path}: no header line")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise CsvError(f"{path}: the header names {duplicates} more than once")
    return names


def read_batches(path: str, names: list[str], block_bytes: int = BLOCK_BYTES) -> Iterator[pa.RecordBatch]:
    """The file's rows in record batches of strings (null: an empty cell), the header skipped."""
    strings = {name: pa.large_string() for name in names}
    with FileSystems.open(path) as f:
        try:
            reader = pacsv.open_csv(
                f,
                read_options=pacsv.ReadOptions(column_names=names, skip_rows=1, block_size=block_bytes, use_threads=False),
                parse_options=pacsv.ParseOptions(newlines_in_values=True, ignore_empty_lines=True),
                convert_options=pacsv.ConvertOptions(column_types=strings, null_values=[""], strings_can_be_null=True,
                                                     quoted_strings_can_be_null=True),
            )
            yield from reader
        except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
            raise CsvError(f"{path}: {exc}") from None


def _python_type(cell: bytes) -> ColumnType:
    """tfx_bsl's own rule for one cell (csv_decoder._InferValueType)."""
    try:
        return ColumnType.INT if _INT64.min <= int(cell) <= _INT64.max else ColumnType.STRING
    except ValueError:
        try:
            float(cell)
        except ValueError:
            return ColumnType.STRING
        return ColumnType.FLOAT


def _cast(values: pa.Array, to: pa.DataType) -> pa.Array | None:
    try:
        return pc.cast(values, to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _slow_type(values: pa.Array) -> ColumnType:
    """Python's rule over the distinct values."""
    return max(_python_type(v) for v in pc.unique(values).cast(pa.large_binary()).to_pylist())


def column_type(values: pa.Array) -> ColumnType:
    """The type the stock component infers for these cells (strings, null when empty)."""
    present = values.drop_null()
    if len(present) == 0:
        return ColumnType.UNKNOWN
    plain = pc.match_substring_regex(present, _PLAIN_INT)
    python_only = pc.match_substring_regex(present, _PYTHON_ONLY)
    found = ColumnType.UNKNOWN
    ints = present.filter(plain)
    if len(ints):
        found = ColumnType.INT if _cast(pc.replace_substring_regex(ints, r"^\+", ""), pa.int64()) is not None else ColumnType.STRING
    odd = present.filter(python_only)
    if len(odd):
        found = max(found, _slow_type(odd))
    rest = present.filter(pc.invert(pc.or_(plain, python_only)))
    if len(rest):
        found = max(found, ColumnType.FLOAT if _cast(rest, pa.float64()) is not None else _slow_type(rest))
    return found


def merge_types(a: dict[str, ColumnType], b: dict[str, ColumnType]) -> dict[str, ColumnType]:
    """Types seen in two parts of a split: the higher of the two (INT < FLOAT < STRING)."""
    return {name: max(a.get(name, ColumnType.UNKNOWN), b.get(name, ColumnType.UNKNOWN)) for name in {*a, *b}}


def _values(present: pa.Array, kind: ColumnType) -> pa.Array:
    """Present cells as the tf.Example value type of their column."""
    if kind == ColumnType.STRING:
        return present.cast(pa.large_binary())
    needs_python = pc.any(pc.match_substring_regex(present, _PYTHON_ONLY)).as_py()
    if kind == ColumnType.INT:
        if not needs_python:
            return pc.cast(pc.replace_substring_regex(present, r"^\+", ""), pa.int64())
        return pa.array([int(v) for v in present.cast(pa.large_binary()).to_pylist()], pa.int64())
    if not needs_python:
        doubles = pc.cast(present, pa.float64())
    else:
        doubles = pa.array([float(v) for v in present.cast(pa.large_binary()).to_pylist()], pa.float64())
    # As the stock path: Python float (double), then the proto's float32.
    return pc.cast(doubles, pa.float32(), safe=False)


def _feature_column(values: pa.Array, kind: ColumnType) -> pa.Array:
    """One value list per row: [value], or [] where the cell is empty; null for an UNKNOWN column
    (the encoder writes a value-less feature, as the stock component does)."""
    if kind == ColumnType.UNKNOWN:
        return pa.nulls(len(values), pa.large_list(pa.large_binary()))
    valid = np.asarray(values.is_valid(), dtype=np.int64) if values.null_count else np.ones(len(values), np.int64)
    offsets = np.concatenate([[0], np.cumsum(valid)])
    return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), _values(values.drop_null(), kind))


def encode(batch: pa.RecordBatch, types: dict[str, ColumnType]) -> list[bytes]:
    """The batch's rows as serialized tf.Examples, serialized deterministically (map keys sorted),
    so that the same row always gives the same bytes, as the stock split hashes them."""
    columns = [_feature_column(batch.column(name), types[name]) for name in batch.schema.names]
    lists = pa.RecordBatch.from_arrays(columns, names=batch.schema.names)
    records = example_coder.RecordBatchToExamplesEncoder().encode(lists)
    parse = example_pb2.Example.FromString
    return [parse(r).SerializeToString(deterministic=True) for r in records]


def partition(records: list[bytes], buckets: list[int]) -> list[list[bytes]]:
    """Records per output split, by the stock ExampleGen's rule: sha256 of the serialized example
    modulo the total hash buckets, each split owning a cumulative range of buckets."""
    total = buckets[-1]
    splits: list[list[bytes]] = [[] for _ in buckets]
    for record in records:
        bucket = int.from_bytes(hashlib.sha256(record).digest(), "big") % total
        splits[bisect.bisect(buckets, bucket)].append(record)
    return splits


def tfrecord_frames(records: list[bytes]) -> bytes:
    """The records in TFRecord framing (length, masked CRC32C of the length, data, masked CRC32C)."""
    import google_crc32c  # the C implementation Beam's and TF's writers use too

    def masked(data: bytes) -> bytes:
        crc = google_crc32c.value(data)
        return (((crc >> 15) | (crc << 17)) + 0xA282EAD8 & 0xFFFFFFFF).to_bytes(4, "little")

    out = io.BytesIO()
    for record in records:
        length = len(record).to_bytes(8, "little")
        out.write(length)
        out.write(masked(length))
        out.write(record)
        out.write(masked(record))
    return out.getvalue()
