"""How loopline reads a CSV file: the options of the `data:` section (missing markers, delimiter,
encoding) and the rules every CSV reader of loopline shares (the Arrow ExampleGen, `loopline
train`, the checks before a run). Standard library only, so any package may import it.

- The header is the first row. A UTF-8 byte-order mark is not part of the first name.
- A cell whose whole text is one of `na_values` is missing, in every column, quoted or not
  (pandas' rule with its default list, `pandas._libs.parsers.STR_NA_VALUES`).
- `delimiter` is one of DELIMITERS, or `auto`: chosen from the first lines by Python's
  `csv.Sniffer` among DELIMITERS.
- Cells are decoded with `encoding`; bytes it cannot decode stop the read with the line and byte.
"""
from __future__ import annotations

import codecs
import contextlib
import csv
import io
import itertools
import sys
from dataclasses import dataclass
from typing import Iterable, Iterator, Literal, get_args

# pandas' default missing markers (pandas._libs.parsers.STR_NA_VALUES, pandas 2.x; the empty field first).
PANDAS_NA_VALUES = ("", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
                    "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null")
Delimiter = Literal[",", ";", "\t", "|", "auto"]
DELIMITERS = tuple(d for d in get_args(Delimiter) if d != "auto")
SNIFF_BYTES = 1 << 16  # the header and the first lines: what `auto` and the header are read from


class CsvError(ValueError):
    """A CSV that cannot be read; the message names the file and where."""


@dataclass(frozen=True)
class CsvOptions:
    na_values: tuple[str, ...] = PANDAS_NA_VALUES
    delimiter: str = ","  # one of DELIMITERS, or "auto" until a file's header resolves it
    encoding: str = "utf-8"

    def to_dict(self) -> dict:
        return {"na_values": list(self.na_values), "delimiter": self.delimiter, "encoding": self.encoding}

    @classmethod
    def from_dict(cls, values: dict) -> "CsvOptions":
        return cls(tuple(values["na_values"]), values["delimiter"], values["encoding"])

    @property
    def is_utf8(self) -> bool:
        """The encoding is UTF-8, which Arrow reads itself (any other goes through Python's codec)."""
        return codecs.lookup(self.encoding).name == "utf-8"


def check_encoding(name: str) -> str:
    """The name when Python knows the codec; else ValueError."""
    try:
        codecs.lookup(name)
    except LookupError:
        raise ValueError(f"unknown encoding {name!r} (a Python codec name: utf-8, latin-1, cp1252, utf-16...)") from None
    return name


SET_ENCODING = "set data.encoding to the file's encoding (e.g. latin-1 or cp1252)"


def codec_refused(path: str, encoding: str, exc: UnicodeError) -> CsvError:
    """A codec's refusal of the whole stream rather than of some bytes (UTF-16 without a
    byte-order mark)."""
    return CsvError(f"{path}: not {encoding} text ({exc}); {SET_ENCODING}")


def undecodable(path: str, chunks: Iterable[bytes], encoding: str, column: str | None = None) -> CsvError | None:
    """The error for the first bytes of `chunks` (a file from its start) that `encoding` cannot
    decode, naming the line (counted in b"\\n" bytes) and the byte offset; None if all decode."""
    decoder = codecs.getincrementaldecoder(encoding)()
    offset, lines = 0, 0
    for chunk in itertools.chain(chunks, [None]):  # None: the end, where a cut character is an error
        pending = decoder.getstate()[0]  # bytes of a character cut by the previous chunk
        try:
            decoder.decode(chunk or b"", final=chunk is None)
        except UnicodeDecodeError as exc:
            data = pending + (chunk or b"")
            at = offset - len(pending) + exc.start
            line = lines - pending.count(b"\n") + data.count(b"\n", 0, exc.start) + 1
            where = f" in column '{column}'" if column else ""
            return CsvError(f"{path}: line {line}, byte offset {at}: 0x{data[exc.start:exc.end].hex()}{where} is not valid "
                            f"{encoding} ({exc.reason}); {SET_ENCODING}")
        except UnicodeError as exc:
            return codec_refused(path, encoding, exc)
        if chunk is not None:
            offset, lines = offset + len(chunk), lines + chunk.count(b"\n")
    return None


def _sniff(path: str, lines: list[str]) -> str:
    if not any(d in lines[0] for d in DELIMITERS):
        return ","  # one column
    try:
        return csv.Sniffer().sniff("\n".join(lines[:50]), delimiters="".join(DELIMITERS)).delimiter
    except csv.Error:
        raise CsvError(f"{path}: cannot tell the delimiter from the first lines; set data.delimiter to one of "
                       f"{', '.join(map(repr, DELIMITERS))}") from None


def _header_text(path: str, sample: bytes, complete: bool, encoding: str) -> tuple[str, bool]:
    """The sample decoded, and whether it is the whole file. Bytes that cannot be decoded in the
    header stop the read; further on, the text up to them is the sample (the full read will stop)."""
    try:
        try:
            return codecs.getincrementaldecoder(encoding)().decode(sample, final=complete), complete
        except UnicodeDecodeError as exc:
            text = codecs.getincrementaldecoder(encoding)().decode(sample[:exc.start])
    except UnicodeError as exc:
        raise codec_refused(path, encoding, exc) from None
    if "\n" not in text:
        raise undecodable(path, [sample], encoding) from None
    return text, False


def parse_header(path: str, sample: bytes, complete: bool, options: CsvOptions) -> tuple[list[str], CsvOptions]:
    """The column names from a file's first bytes (SNIFF_BYTES of them, or the whole file when
    `complete`), and the options with the delimiter resolved."""
    text, complete = _header_text(path, sample, complete, options.encoding)
    text = text.removeprefix("\ufeff")  # a byte-order mark (Excel's "CSV UTF-8") is not part of a name
    lines = list(io.StringIO(text, newline=""))
    if not complete and lines and not lines[0].endswith(("\n", "\r")):  # the names would be cut
        raise CsvError(f"{path}: the header line is longer than {SNIFF_BYTES >> 10} KiB")
    if not complete and len(lines) > 1 and not lines[-1].endswith(("\n", "\r")):
        lines = lines[:-1]  # cut by the sample
    lines = [line.rstrip("\r\n") for line in lines]
    if not lines or not lines[0].strip():
        raise CsvError(f"{path}: empty, or no header line")
    delimiter = _sniff(path, lines) if options.delimiter == "auto" else options.delimiter
    names = next(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter))
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise CsvError(f"{path}: the header names {duplicates} more than once")
    return names, CsvOptions(options.na_values, delimiter, options.encoding)


def _lines(chunks: Iterable[bytes], encoding: str) -> Iterator[str]:
    """The decoded lines, each with its line end (\\n, \\r\\n or \\r), as csv.reader takes them.
    Bytes the encoding cannot decode become U+FFFD: the lines are only counted."""
    carry = ""
    for part in codecs.iterdecode(chunks, encoding, errors="replace"):
        lines = list(io.StringIO(carry + part, newline=""))
        carry = lines.pop() if lines and not lines[-1].endswith("\n") else ""  # may go on in the next part
        yield from lines
    if carry:
        yield carry


@contextlib.contextmanager
def _any_cell_size() -> Iterator[None]:
    """csv.reader refuses cells over 128 KiB (its field_size_limit); Arrow reads any size."""
    limit = csv.field_size_limit()
    csv.field_size_limit(sys.maxsize)
    try:
        yield
    finally:
        csv.field_size_limit(limit)


def line_of_row(chunks: Iterable[bytes], options: CsvOptions, row: int) -> int | None:
    """The line where CSV row `row` starts (1: the header; blank lines are not rows, as Arrow
    counts them), reading the file from its start in Python: for error messages only."""
    reader = csv.reader(_lines(chunks, options.encoding), delimiter=options.delimiter)
    count, start = 0, 1
    with _any_cell_size():
        for record in reader:
            if record:
                count += 1
                if count == row:
                    return start
            start = reader.line_num + 1
    return None
