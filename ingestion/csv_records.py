"""CSV files to serialized tf.Examples a record batch at a time, with the stock CsvExampleGen's rules
for types and numbers, and loopline's CSV options (ingestion/csv_options.py) for missing markers,
the delimiter and the encoding.

The stock component (tfx_bsl's csv_decoder) parses every line in Python. Here Arrow parses the
file in blocks, and each block's tf.Examples are written with numpy a column at a time, in the
bytes protobuf's deterministic serialization gives (the bytes the stock split hashes), while the
results stay those of the stock component:
- a column is INT when every present cell is an int64 to Python's `int(cell)`, else FLOAT when
  every one is a number to `float(cell)`, else STRING (ints beyond int64 make it STRING);
- a missing cell (one of `na_values`, quoted or not; the stock rule: the empty cell only) is an
  empty value list of the column's type; a column with no value at all gives value-less features;
- blank lines are skipped; a row with another number of cells than the header, or a quote the
  file ends inside of, is an error.
Cells that Arrow's parsers and Python's read differently (blanks and underscores inside numbers,
`nan` spellings, `+`, hex) go through Python's own `int`/`float` on the cell's bytes.

Arrow checks that every cell is valid UTF-8 (or decodes the file with `encoding`) as it parses, so
the pass that infers the types is also the one that finds undecodable bytes; only then is the file
read again, in Python, to name the line and byte. Files are opened through Beam's filesystems, so
every scheme Beam knows works (gs://, and the tests' ram://).
"""
from __future__ import annotations

import hashlib
import re
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from apache_beam.io.filesystems import FileSystems
from isal import isal_zlib
from tfx_bsl.coders.csv_decoder import ColumnType

from ingestion.csv_options import SNIFF_BYTES, CsvError, CsvOptions, line_of_row, parse_header, undecodable

# Arrow parses this much of a file at a time: the memory per batch. Each block costs a fixed share
# (the statistics' merge, numpy's and Arrow's per-call work): 2 MiB took 6.6% fewer instructions
# than 512 KiB to type, encode, split and summarize 1M rows (callgrind); 4 MiB no fewer CPU seconds.
BLOCK_BYTES = 1 << 21
_INT64 = np.iinfo(np.int64)
_PLAIN_INT = r"^[+-]?[0-9]+$"  # Python's int() and Arrow's int64 parser agree on these (less the '+').
# Python reads these, Arrow does not (or reads them another way): whitespace and underscores in
# numbers, and NaN (Python keeps the sign of '-nan').
_PYTHON_ONLY = r"[\t\n\v\f\r _]|[nN][aA][nN]"


def read_header(path: str, options: CsvOptions) -> tuple[list[str], CsvOptions]:
    """The column names in the file's first row, and the options with the delimiter resolved."""
    with FileSystems.open(path) as f:
        sample = f.read(SNIFF_BYTES + 1)
    return parse_header(path, sample[:SNIFF_BYTES], len(sample) <= SNIFF_BYTES, options)


def _chunks(path: str, size: int = 1 << 20) -> Iterator[bytes]:
    with FileSystems.open(path) as f:
        while chunk := f.read(size):
            yield chunk


def line_of(path: str, options: CsvOptions, row: int) -> int | None:
    """The line of the file where CSV row `row` starts (1: the header): for error messages only."""
    return line_of_row(_chunks(path), options, row)


# Arrow's message for a row with another number of cells than the header (pyarrow's
# invalid_row_handler would give the same fields, but it decodes the row's text as UTF-8 before
# calling the handler and prints a traceback when that fails).
_BAD_ROW = re.compile(r"Row #(\d+): Expected (\d+) columns, got (\d+): (.*)", re.S)


def _read_error(path: str, names: list[str], options: CsvOptions, exc: Exception) -> CsvError:
    """What Arrow (or the codec) refused, with the file's line: found by reading the file again in
    Python, which only a failing read pays for."""
    if isinstance(exc, UnicodeError) or "invalid UTF8" in str(exc):
        column = re.search(r"CSV column #(\d+)", str(exc))
        found = undecodable(path, _chunks(path), options.encoding, names[int(column.group(1))] if column else None)
        if found is not None:
            return found
    bad_row = _BAD_ROW.search(str(exc))
    if bad_row:
        number, expected, actual, text = bad_row.groups()
        line = line_of(path, options, int(number))
        return CsvError(f"{path}: line {line}: {actual} cells where the header has {expected}: {text[:200]!r}")
    return CsvError(f"{path}: {' '.join(str(exc).split())}")


def _unclosed_quote(path: str, last_row: pa.RecordBatch, options: CsvOptions) -> bool:
    """The file's last cell is a quoted one that the file ends inside of: Arrow takes everything up
    to the end as that cell. Only the last column can hide it (elsewhere the row is short a cell),
    and only a quoted cell holds a line end; a closed one is followed by its quote."""
    cell = last_row.column(last_row.num_columns - 1)[0].as_py() if last_row.num_columns else None
    if not cell or not ("\n" in cell or "\r" in cell):
        return False
    tail = cell.encode(options.encoding, errors="replace")
    with FileSystems.open(path) as f:
        size = f.seek(0, 2)  # the end, through Beam's filesystems (no local size to ask for)
        f.seek(max(size - len(tail), 0))
        return f.read() == tail


def read_batches(path: str, names: list[str], options: CsvOptions,
                 block_bytes: int = BLOCK_BYTES) -> Iterator[pa.RecordBatch]:
    """The file's rows in record batches of strings (null: a missing cell), the header skipped."""
    strings = {name: pa.large_string() for name in names}
    rows, last = 0, None
    with FileSystems.open(path) as f:
        try:
            reader = pacsv.open_csv(
                f,
                read_options=pacsv.ReadOptions(column_names=names, skip_rows=1, block_size=block_bytes, use_threads=False,
                                               encoding="utf8" if options.is_utf8 else options.encoding),
                parse_options=pacsv.ParseOptions(delimiter=options.delimiter, newlines_in_values=True,
                                                 ignore_empty_lines=True),
                convert_options=pacsv.ConvertOptions(column_types=strings, null_values=list(options.na_values),
                                                     strings_can_be_null=True, quoted_strings_can_be_null=True),
            )
            for batch in reader:
                rows, last = rows + batch.num_rows, batch if batch.num_rows else last
                yield batch
        except (pa.ArrowInvalid, UnicodeError) as exc:
            raise _read_error(path, names, options, exc) from None
    if last is not None and _unclosed_quote(path, last.slice(last.num_rows - 1), options):
        line = line_of(path, options, rows + 1)
        raise CsvError(f"{path}: line {line}: a quoted cell is not closed (a '\"' without its closing '\"'); "
                       "everything from there to the end of the file would be one cell")


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
    present = pc.unique(values.drop_null())  # the rule is per value: each distinct one once
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


def file_types(path: str, names: list[str], options: CsvOptions) -> dict[str, ColumnType]:
    """The column types over one file's batches (the stock ColumnTypeInferrer's rule). This pass
    reads every cell, so it is the one that stops on bytes the encoding cannot decode."""
    types: dict[str, ColumnType] = {}
    for batch in read_batches(path, names, options):
        types = merge_types(types, {n: column_type(batch.column(n)) for n in names})
    return types


def _values(present: pa.Array, kind: ColumnType) -> pa.Array:
    """Present cells as the tf.Example value type of their column."""
    if kind == ColumnType.STRING:
        return present.cast(pa.large_binary())
    needs_python = pc.any(pc.match_substring_regex(pc.unique(present), _PYTHON_ONLY)).as_py()
    if kind == ColumnType.INT:
        if not needs_python:  # then every cell is a plain int (column_type): only a '+' to drop
            return pc.cast(pc.utf8_ltrim(present, characters="+"), pa.int64())
        return pa.array([int(v) for v in present.cast(pa.large_binary()).to_pylist()], pa.int64())
    if not needs_python:
        doubles = pc.cast(present, pa.float64())
    else:
        doubles = pa.array([float(v) for v in present.cast(pa.large_binary()).to_pylist()], pa.float64())
    # As the stock path: Python float (double), then the proto's float32.
    return pc.cast(doubles, pa.float32(), safe=False)


# tf.Example in protobuf's wire format, built a column at a time. Every CSV feature holds one value
# or none, and deterministic serialization writes a message's fields in field-number order and a
# map's entries sorted by key, so each row's bytes are fixed by these rules:
#   Example   = 0x0A len Features                   (features = 1)
#   Features  = (0x0A len Entry)* sorted by key     (map<string, Feature> feature = 1)
#   Entry     = 0x0A len key, 0x12 len Feature      (key = 1, value = 2)
#   Feature   = tag len List, tag 0x0A bytes_list, 0x12 float_list, 0x1A int64_list; none: empty
#   List      = 0x0A len payload                    (value = 1: a bytes, packed fixed32 or varints)
# A row's bytes are laid out from pieces: constant bytes, or (data, sizes): each row's next
# `sizes[i]` bytes of `data`. Sizes are counted first: a message's length is written before it.
_LIST_TAG = {ColumnType.STRING: b"\x0a", ColumnType.FLOAT: b"\x12", ColumnType.INT: b"\x1a"}


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _varints(values: np.ndarray, lead: bytes = b"") -> tuple[np.ndarray, np.ndarray]:
    """`lead` then each value's protobuf varint (a negative int64: its 10-byte two's complement)."""
    v = np.asarray(values, np.int64).view(np.uint64)
    if not (v >= np.uint64(0x80)).any():  # one byte each, the usual case for sizes: the value itself
        groups = np.empty((len(v), len(lead) + 1), np.uint8)
        groups[:, :len(lead)] = np.frombuffer(lead, np.uint8)
        groups[:, len(lead)] = v
        return groups.reshape(-1), np.full(len(v), len(lead) + 1, np.int64)
    sizes = np.ones(len(v), np.int64)
    for k in range(1, 10):
        longer = v >= np.uint64(1 << (7 * k))
        if not longer.any():
            break
        sizes += longer
    place = np.arange(int(sizes.max(initial=1)))
    groups = ((v[:, None] >> (place * 7).astype(np.uint64)) & np.uint64(0x7F)).astype(np.uint8)
    groups[place[None, :] < sizes[:, None] - 1] |= 0x80  # more bytes follow
    if lead:
        groups = np.hstack([np.broadcast_to(np.frombuffer(lead, np.uint8), (len(v), len(lead))), groups])
        place, sizes = np.arange(groups.shape[1]), sizes + len(lead)
    if (sizes == groups.shape[1]).all():
        return groups.reshape(-1), sizes
    return groups[place[None, :] < sizes[:, None]], sizes


def _varint_size(values: np.ndarray) -> np.ndarray:
    """The bytes of each size's varint (sizes below 2**35)."""
    return 1 + sum((values >= 1 << (7 * k)).astype(np.int64) for k in range(1, 5))


def _binary(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A binary array's bytes and each row's size."""
    values = values.cast(pa.large_binary())  # 64-bit offsets, read below
    offsets = np.frombuffer(values.buffers()[1], np.int64, len(values) + 1, values.offset * 8)
    data = np.frombuffer(values.buffers()[2], np.uint8, offsets[-1] - offsets[0], offsets[0]) if offsets[-1] > offsets[0] else np.zeros(0, np.uint8)
    return data, np.diff(offsets)


def _sizes(pieces: list, rows: int) -> np.ndarray:
    return sum((len(p) if isinstance(p, bytes) else p[1] for p in pieces), np.zeros(rows, np.int64))


def _layout(pieces: list, rows: int) -> pa.Array:
    """Each row's pieces one after the other, as a large_binary array: one binary array per piece
    joined row by row in Arrow's C++ (`binary_join_element_wise`). Runs of pieces of the same width
    on every row are stacked into one array first (a piece costs more than its bytes)."""
    if not rows:
        return pa.array([], pa.large_binary())
    arrays: list[pa.Array] = []
    run: list[np.ndarray] = []

    def flush() -> None:
        if run:
            matrix = np.hstack(run)  # a new C-ordered array: each row's bytes together
            arrays.append(_arrow(matrix.reshape(-1), np.arange(rows + 1, dtype=np.int64) * matrix.shape[1]))
            run.clear()

    for piece in pieces:
        if isinstance(piece, bytes):
            run.append(np.broadcast_to(np.frombuffer(piece, np.uint8), (rows, len(piece))))
            continue
        data, counts = piece
        if counts.min() == counts.max():
            run.append(data.reshape(rows, counts[0]))
            continue
        flush()
        offsets = np.zeros(rows + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        arrays.append(_arrow(data, offsets))
    flush()
    return pc.binary_join_element_wise(*arrays, pa.scalar(b"", pa.large_binary()))


def _arrow(data: np.ndarray, offsets: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _fixed(values: np.ndarray) -> pa.Array:
    """Each value's little-endian bytes, one row each."""
    width = values.dtype.itemsize
    return _arrow(values.astype(values.dtype.newbyteorder("<")).view(np.uint8), np.arange(len(values) + 1, dtype=np.int64) * width)


def _payloads(values: pa.Array, kind: ColumnType) -> list[tuple[np.ndarray, np.ndarray]]:
    """The List message (field 1 and the value) of each present cell, in pieces; `values`: the
    present cells as their column's tf.Example type (`_values`)."""
    if kind == ColumnType.STRING:
        data, lengths = _binary(values)
        return [_varints(lengths, lead=b"\x0a"), (data, lengths)]
    if kind == ColumnType.FLOAT:
        floats = values.to_numpy(zero_copy_only=False).astype("<f4").view(np.uint8).reshape(-1, 4)
        lead = np.broadcast_to(np.array([0x0A, 4], np.uint8), (len(floats), 2))
        return [(np.hstack([lead, floats]).reshape(-1), np.full(len(floats), 6, np.int64))]
    data, sizes = _varints(values.to_numpy(zero_copy_only=False))  # packed: the varint's size first
    return [_varints(sizes, lead=b"\x0a"), (data, sizes)]


def _entries(name: str, valid: np.ndarray, values: pa.Array | None, kind: ColumnType) -> list:
    """Each row's map entry for this column, in pieces: the name and a Feature with the cell's
    value, an empty list of the column's type for an empty cell, no list for an UNKNOWN column."""
    key = name.encode("utf-8")
    head = b"\x0a" + _varint(len(key)) + key + b"\x12"
    if kind == ColumnType.UNKNOWN:
        body = head + b"\x00"
        return [b"\x0a" + _varint(len(body)) + body]
    payloads = []
    for data, sizes in _payloads(values, kind):
        counts = np.zeros(len(valid), np.int64)
        counts[valid] = sizes  # empty cells: no bytes
        payloads.append((data, counts))
    lists = sum(counts for _, counts in payloads)
    feature = 1 + _varint_size(lists) + lists
    body = len(head) + _varint_size(feature) + feature
    return [b"\x0a", _varints(body), head, _varints(feature), _LIST_TAG[kind], _varints(lists), *payloads]


def _typed_columns(batch: pa.RecordBatch, types: dict[str, ColumnType]) -> list[tuple]:
    """(name, kind, each row's cell present, the present cells as the column's tf.Example type or
    None for an UNKNOWN column) per column, in the order protobuf writes a map's keys (bytewise)."""
    typed = []
    for name in sorted(batch.schema.names, key=lambda n: n.encode("utf-8")):
        cells, kind = batch.column(name), types[name]
        valid = np.asarray(cells.is_valid(), bool) if cells.null_count else np.ones(len(cells), bool)
        typed.append((name, kind, valid, None if kind == ColumnType.UNKNOWN else _values(cells.drop_null(), kind)))
    return typed


def _records(typed: list[tuple], rows: int) -> pa.Array:
    entries = [piece for name, kind, valid, values in typed for piece in _entries(name, valid, values, kind)]
    return _layout([b"\x0a", _varints(_sizes(entries, rows)), *entries], rows)


def encode(batch: pa.RecordBatch, types: dict[str, ColumnType]) -> pa.Array:
    """The batch's rows as tf.Examples serialized as protobuf's deterministic serialization writes
    them (the bytes the stock split hashes), one row of a large_binary array per example."""
    return _records(_typed_columns(batch, types), batch.num_rows)


def encode_with_columns(batch: pa.RecordBatch, types: dict[str, ColumnType]) -> tuple[pa.Array, pa.RecordBatch]:
    """`encode`'s examples, and the same examples as tfx-bsl's ExamplesToRecordBatchDecoder
    decodes them (what statistics are computed from), built from the same typed values: a
    large_list column of the example's value type per feature, an empty list for an empty cell,
    a null column for an UNKNOWN one."""
    typed = _typed_columns(batch, types)
    columns = []
    for _, _, valid, values in typed:
        if values is None:
            columns.append(pa.nulls(len(valid)))
        else:
            offsets = np.zeros(len(valid) + 1, np.int64)
            np.cumsum(valid, out=offsets[1:])
            columns.append(pa.LargeListArray.from_arrays(pa.array(offsets), values))
    return _records(typed, batch.num_rows), pa.RecordBatch.from_arrays(columns, [name for name, *_ in typed])


def _buckets(digests: bytes, total: int) -> np.ndarray:
    """Each sha256 digest read as a big-endian integer, modulo `total`: the bytes weighted by
    256**k mod total, summed (exact in int64 while 32 * 255 * total < 2**63)."""
    if total >= 1 << 50:
        return np.array([int.from_bytes(digests[i:i + 32], "big") % total for i in range(0, len(digests), 32)], np.int64)
    weights = np.array([pow(256, 31 - k, total) for k in range(32)], np.int64)
    return (np.frombuffer(digests, np.uint8).reshape(-1, 32).astype(np.int64) @ weights) % total


def _masked_crc(crcs: np.ndarray) -> np.ndarray:
    crcs = crcs.astype(np.uint32)
    return ((crcs >> np.uint32(15)) | (crcs << np.uint32(17))) + np.uint32(0xA282EAD8)


def _frames(records: pa.Array, crcs: np.ndarray) -> bytes:
    """The records in TFRecord framing: length, masked CRC32C of the length, data, masked CRC32C."""
    import google_crc32c  # the C implementation Beam's and TF's writers use too

    lengths = pc.binary_length(records).to_numpy(zero_copy_only=False).astype(np.uint64)
    distinct, which = np.unique(lengths, return_inverse=True)
    length_crcs = np.array([google_crc32c.value(int(n).to_bytes(8, "little")) for n in distinct], np.uint32)[which]
    empty = pa.scalar(b"", pa.large_binary())
    framed = pc.binary_join_element_wise(_fixed(lengths), _fixed(_masked_crc(length_crcs)), records, _fixed(_masked_crc(crcs)), empty)
    return _binary(framed)[0].tobytes()


def split_frames(records: pa.Array, buckets: list[int] | None) -> list[bytes]:
    """TFRecord-framed records per output split (see `split_records`)."""
    return split_records(records, buckets)[0]


def _rows(records: pa.Array) -> list[bytes]:
    """Each record as bytes: slices of one copy of the array's data (half the time of to_pylist,
    which makes a scalar per row)."""
    data, sizes = _binary(records)
    ends = np.cumsum(sizes).tolist()
    data = data.tobytes()
    return [data[start:end] for start, end in zip([0, *ends[:-1]], ends)]


def split_records(records: pa.Array, buckets: list[int] | None) -> tuple[list[bytes], np.ndarray, list[bytes]]:
    """TFRecord-framed records per output split, by the stock ExampleGen's rule: sha256 of the
    serialized example modulo the total hash buckets, each split owning a cumulative range of
    buckets (cumulative ends in `buckets`; None: one split, all records); each record's split
    (its index in `buckets`); and each record's bytes."""
    import google_crc32c

    rows = _rows(records)
    crcs = np.fromiter((google_crc32c.value(r) for r in rows), np.uint32, len(rows))
    if not buckets:
        return [_frames(records, crcs)], np.zeros(len(rows), np.int64), rows
    digests = b"".join([hashlib.sha256(r).digest() for r in rows])
    split = np.searchsorted(np.asarray(buckets), _buckets(digests, buckets[-1]), side="right")
    return [_frames(records.filter(pa.array(split == i)), crcs[split == i]) for i in range(len(buckets))], split, rows


# ISA-L's deflate (isal): the same GZIP stream any reader takes; its level 1 compressed the
# framed records about 6x faster than zlib's level 1 (itself 2.5x faster than Beam's default
# level 6) into files of about zlib's level-1 size, ~20% larger than level 6's.
GZIP_LEVEL = 1


class GzipFile:
    """One GZIP stream at GZIP_LEVEL over an open binary file (framed records in, a .gz TFRecord
    file out); `crc32c` and `size`: of the bytes written to the file so far."""

    def __init__(self, raw):
        self._raw = raw
        self._gzip = isal_zlib.compressobj(GZIP_LEVEL, isal_zlib.DEFLATED, 16 + isal_zlib.MAX_WBITS)
        self.crc32c = 0
        self.size = 0

    def write(self, data: bytes) -> None:
        self._out(self._gzip.compress(data))

    def close(self) -> None:
        self._out(self._gzip.flush())
        self._raw.close()

    def _out(self, data: bytes) -> None:
        import google_crc32c

        self._raw.write(data)
        self.crc32c = google_crc32c.extend(self.crc32c, data)
        self.size += len(data)
