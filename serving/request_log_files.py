"""The request log on disk (or in a bucket), through TensorFlow's file systems only:

    <log dir>/<model>/<version>/<prefix>-<first>-<last>-<token>.tfrecord.gz       PredictionLog records
    <log dir>/<model>/<version>/<prefix>-<first>-<last>-<token>.index.jsonl       its sidecar index

A file is written under a hidden temporary name and published when it is closed: the index first,
then the records, each renamed into place, so a reader that lists the records files sees only
closed files, each with its index (object stores show an object only once it is closed anyway).
`first` and `last` are the times of its first and last record (UTC, to the millisecond), so a
reader picks the files of a time window by their names. The index has one JSON line per record:
the request id (PredictionLog has no field for one), the file, the record's number, its time.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import re
import time
import uuid
from dataclasses import dataclass
from typing import Iterator

import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

RECORDS_SUFFIX = ".tfrecord.gz"
INDEX_SUFFIX = ".index.jsonl"
IN_PROGRESS = ".inprogress"
DEFAULT_PREFIX = "requests"
GZIP_LEVEL = 1  # zlib's fastest, as the ExampleGen writes: the writer shares the server's core
_STAMP = "%Y%m%dT%H%M%S"
_NAME = re.compile(r"(?P<prefix>.+)-(?P<first>\d{8}T\d{6}\.\d{3}Z)-(?P<last>\d{8}T\d{6}\.\d{3}Z)-(?P<token>[0-9a-f]{8})$")


def stamp(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return f"{moment:{_STAMP}}.{moment.microsecond // 1000:03d}Z"


def parse_stamp(text: str) -> float:
    moment = datetime.datetime.strptime(text[:-5], _STAMP).replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp() + int(text[-4:-1]) / 1000


def version_dir(log_dir: str, model: str, version: int) -> str:
    return os.path.join(log_dir, model, str(version))


class LogFile:
    """One open file of a model version's log: records go to a GZIP TFRecord file under a hidden
    name, the index rows stay in memory until close() publishes both."""

    def __init__(self, folder: str, prefix: str = DEFAULT_PREFIX):
        tf.io.gfile.makedirs(folder)
        self.folder, self.prefix = folder, prefix
        self.token = uuid.uuid4().hex[:8]
        self.opened = time.time()
        self.staged = os.path.join(folder, f".{prefix}-{self.token}{IN_PROGRESS}")
        self._writer = tf.io.TFRecordWriter(self.staged, tf.io.TFRecordOptions("GZIP", compression_level=GZIP_LEVEL))
        self.bytes = 0
        self._rows: list[tuple[str, float]] = []  # (request id, time) per record

    @property
    def records(self) -> int:
        return len(self._rows)

    def write(self, record: bytes, request_id: str, at: float) -> None:
        self._writer.write(record)
        self.bytes += len(record)
        self._rows.append((request_id, at))

    def close(self) -> str | None:
        """Publishes the file (None when it holds no record: nothing to read, nothing left)."""
        self._writer.close()
        if not self._rows:
            tf.io.gfile.remove(self.staged)
            return None
        name = f"{self.prefix}-{stamp(self._rows[0][1])}-{stamp(self._rows[-1][1])}-{self.token}"
        records_name = name + RECORDS_SUFFIX
        # Times cut (not rounded) to the millisecond, as in the name: never later than the record.
        lines = [json.dumps({"request_id": rid, "file": records_name, "record": i, "time": math.floor(at * 1000) / 1000})
                 for i, (rid, at) in enumerate(self._rows)]
        staged_index = os.path.join(self.folder, f".{name}{INDEX_SUFFIX}{IN_PROGRESS}")
        with tf.io.gfile.GFile(staged_index, "w") as f:
            f.write("\n".join(lines) + "\n")
        tf.io.gfile.rename(staged_index, os.path.join(self.folder, name + INDEX_SUFFIX), overwrite=True)
        path = os.path.join(self.folder, records_name)
        tf.io.gfile.rename(self.staged, path, overwrite=True)
        return path


@dataclass
class ClosedFile:
    path: str  # the records file
    model: str
    version: int
    first: float
    last: float

    @property
    def index_path(self) -> str:
        return self.path[: -len(RECORDS_SUFFIX)] + INDEX_SUFFIX


@dataclass
class LoggedRecord:
    log: prediction_log_pb2.PredictionLog
    request_id: str
    time: float
    version: int
    file: str
    record: int


def _children(folder: str) -> list[str]:
    if not tf.io.gfile.isdir(folder):
        return []
    return [entry.rstrip("/") for entry in tf.io.gfile.listdir(folder)]  # object stores end folders with '/'


def versions(log_dir: str, model: str) -> list[int]:
    return sorted(int(v) for v in _children(os.path.join(log_dir, model)) if v.isdigit())


def closed_files(log_dir: str, model: str, since: float | None = None, until: float | None = None) -> list[ClosedFile]:
    """The published files of a model (every version), oldest first; with a window, those whose
    records' times [first, last] overlap [since, until)."""
    found = []
    for version in versions(log_dir, model):
        folder = version_dir(log_dir, model, version)
        for entry in _children(folder):
            match = _NAME.fullmatch(entry[: -len(RECORDS_SUFFIX)]) if entry.endswith(RECORDS_SUFFIX) else None
            if match is None or entry.startswith("."):
                continue
            first, last = parse_stamp(match["first"]), parse_stamp(match["last"])
            if (since is not None and last < since) or (until is not None and first >= until):
                continue
            found.append(ClosedFile(os.path.join(folder, entry), model, version, first, last))
    return sorted(found, key=lambda f: (f.first, f.path))


def read_index(closed: ClosedFile) -> list[dict]:
    if not tf.io.gfile.exists(closed.index_path):
        raise ValueError(f"{closed.path}: its index {closed.index_path} is missing (request ids cannot be joined)")
    with tf.io.gfile.GFile(closed.index_path) as f:
        return [json.loads(line) for line in f.read().splitlines() if line.strip()]


def read_records(closed: ClosedFile, since: float | None = None, until: float | None = None) -> Iterator[LoggedRecord]:
    """The file's records with their index rows, those timed in [since, until) when given."""
    rows = read_index(closed)
    dataset = tf.data.TFRecordDataset(closed.path, compression_type="GZIP")
    count = 0
    for count, (row, record) in enumerate(zip(rows, dataset.as_numpy_iterator()), start=1):
        if (since is not None and row["time"] < since) or (until is not None and row["time"] >= until):
            continue
        log = prediction_log_pb2.PredictionLog.FromString(record)
        yield LoggedRecord(log, row["request_id"], row["time"], closed.version, closed.path, row["record"])
    if count != len(rows):
        raise ValueError(f"{closed.path}: {count} records read, its index lists {len(rows)}")


def read_window(log_dir: str, model: str, since: float, until: float) -> Iterator[LoggedRecord]:
    """Every logged record of `model` timed in [since, until), file by file."""
    for closed in closed_files(log_dir, model, since, until):
        yield from read_records(closed, since, until)


def delete_older_than(log_dir: str, cutoff: float, open_files: frozenset[str] = frozenset()) -> int:
    """Retention: removes published files whose last record is older than `cutoff`, and leftovers
    of a killed writer not touched since (not the caller's `open_files`); returns how many records
    files went."""
    removed = 0
    for model in _children(log_dir):
        for version in versions(log_dir, model):
            folder = version_dir(log_dir, model, version)
            for entry in _children(folder):
                path = os.path.join(folder, entry)
                match = _NAME.fullmatch(entry[: -len(RECORDS_SUFFIX)]) if entry.endswith(RECORDS_SUFFIX) else None
                try:
                    if match is not None and parse_stamp(match["last"]) < cutoff:
                        index = path[: -len(RECORDS_SUFFIX)] + INDEX_SUFFIX
                        tf.io.gfile.remove(path)  # the records first: a reader never sees one without its index
                        if tf.io.gfile.exists(index):
                            tf.io.gfile.remove(index)
                        removed += 1
                    elif entry.endswith(IN_PROGRESS) and path not in open_files and \
                            tf.io.gfile.stat(path).mtime_nsec / 1e9 < cutoff:
                        tf.io.gfile.remove(path)
                except tf.errors.NotFoundError:
                    continue  # another server's retention got there first
    return removed
