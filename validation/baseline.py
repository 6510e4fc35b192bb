"""The baseline a run's data is checked against: the schema and per-split statistics of the last
run whose model was pushed (or of data accepted with `loopline data accept`).

Kept as files under `<pipeline.root>/baseline/<model name>/`, so it works wherever the pipeline
runs (locally, or in Kubeflow pods that have no ML Metadata connection):

    CURRENT.json                  the record of the baseline in use (replaced atomically)
    <stamp>/baseline.json         each baseline's record (kept: a report can show what a run saw)
    <stamp>/schema.pbtxt          its schema
    <stamp>/Split-<name>/FeatureStats.pb   its statistics, one folder per split

A new baseline is written into a fresh `<stamp>` folder first and `CURRENT.json` is swapped
last, so a reader sees the old baseline or the new one, never half of one. Everything goes
through tf.io.gfile. A baseline that exists but cannot be read is an error naming the file:
checking against nothing would let any change through.
"""
from __future__ import annotations

import datetime
import json
import os
import uuid
from dataclasses import dataclass

import tensorflow as tf
from tensorflow_metadata.proto.v0 import schema_pb2, statistics_pb2

from validation.schema import SCHEMA_FILE, load_schema, write_schema
from validation.statistics import STATS_FILE, read_statistics, write_statistics

CURRENT_FILE = "CURRENT.json"
RECORD_FILE = "baseline.json"  # the same record, kept in the baseline's own folder


class BaselineError(ValueError):
    """A baseline record exists but cannot be used; the message names the file."""


def baseline_dir(root: str, model_name: str) -> str:
    return os.path.join(root, "baseline", model_name)


@dataclass
class Baseline:
    location: str  # the <stamp> folder
    record: dict  # CURRENT.json
    schema: schema_pb2.Schema
    statistics: dict[str, statistics_pb2.DatasetFeatureStatistics]

    @property
    def acceptance(self) -> str:
        """The last `loopline data accept` behind this baseline ("" for none): see cache_key."""
        return self.record.get("acceptance") or ""

    @property
    def accepted(self) -> str:
        """What was accepted into this baseline by `loopline data accept` ("" when it is a pushed run's)."""
        return self.record.get("accepted") or ""

    def describe(self) -> str:
        source = self.record.get("source", {})
        if self.accepted:
            what = f"data accepted on {self.record.get('written_at', '?')} (statistics {source.get('statistics', '?')})"
        else:
            what = f"the run that pushed version {source.get('pushed_version', '?')} (statistics {source.get('statistics', '?')})"
        return f"checked against the baseline: {what}"


def cache_key(directory: str) -> str:
    """What the pipeline's cache must see of the baseline: the last acceptance behind it ("" when
    none). A baseline written by a push holds the data of a run that passed against the one before,
    so re-running that data reuses the cached checks safely; an accepted baseline must not be
    checked through a cache filled before it (the stopped run would stop again)."""
    path = os.path.join(directory, CURRENT_FILE)
    if not tf.io.gfile.exists(path):
        return ""
    try:
        return str(_read_record(path).get("acceptance", ""))
    except BaselineError:
        return "unreadable"  # the components fail on it, naming the file


def _read_record(path: str) -> dict:
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            record = json.loads(f.read())
    except (json.JSONDecodeError, UnicodeDecodeError, tf.errors.OpError) as exc:
        raise BaselineError(f"baseline record {path} cannot be read ({type(exc).__name__}: {exc}); "
                            "restore it or delete the baseline folder to start over") from None
    if not isinstance(record, dict) or not record.get("folder") or not isinstance(record.get("splits"), list):
        raise BaselineError(f"baseline record {path} is not a loopline baseline record (needs 'folder' and 'splits')")
    return record


def read_baseline(directory: str) -> Baseline | None:
    """The baseline in use in `directory`, or None when there is none yet (the first run)."""
    path = os.path.join(directory, CURRENT_FILE)
    if not tf.io.gfile.exists(path):
        return None
    record = _read_record(path)
    return _load(os.path.join(directory, record["folder"]), record, path)


def read_baseline_folder(location: str) -> Baseline:
    """A baseline by its folder (one a run was checked against, even if another is in use now)."""
    path = os.path.join(location, RECORD_FILE)
    if not tf.io.gfile.exists(path):
        raise BaselineError(f"baseline record {path} not found")
    return _load(location, _read_record(path), path)


def baseline_of_version(directory: str, version: int | str) -> Baseline | None:
    """The baseline written when serving version `version` was pushed (the data that model was
    trained and evaluated on), newest first; None when no baseline names it."""
    if not tf.io.gfile.isdir(directory):
        return None
    for folder in sorted((e.rstrip("/") for e in tf.io.gfile.listdir(directory)), reverse=True):
        path = os.path.join(directory, folder, RECORD_FILE)
        if not tf.io.gfile.exists(path):
            continue
        record = _read_record(path)
        if str(record.get("source", {}).get("pushed_version", "")) == str(version):
            return _load(os.path.join(directory, folder), record, path)
    return None


def _load(location: str, record: dict, named_by: str) -> Baseline:
    schema_path = os.path.join(location, SCHEMA_FILE)
    try:
        schema = load_schema(schema_path)
    except (FileNotFoundError, ValueError, tf.errors.OpError) as exc:
        raise BaselineError(f"baseline schema {schema_path} (named by {named_by}) cannot be read: {exc}") from None
    statistics = {}
    for split in record["splits"]:
        split_dir = os.path.join(location, f"Split-{split}")
        try:
            statistics[split] = read_statistics(split_dir)
        except Exception as exc:  # a missing, truncated or foreign file: fail closed, naming it
            raise BaselineError(f"baseline statistics {os.path.join(split_dir, STATS_FILE)} (named by {named_by}) "
                                f"cannot be read ({type(exc).__name__}: {exc})") from None
    return Baseline(location, record, schema, statistics)


def write_baseline(directory: str, schema: schema_pb2.Schema,
                   statistics: dict[str, statistics_pb2.DatasetFeatureStatistics],
                   source: dict[str, str], accepted: str = "", acceptance: str = "") -> str:
    """Records a new baseline; returns its folder. `source` says where it came from (artifact
    URIs, pushed version); `accepted` describes the changes a user accepted into it (it then
    starts a new `acceptance`); else `acceptance` is the one of the baseline it replaces."""
    now = datetime.datetime.now(datetime.timezone.utc)
    folder = f"{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
    if accepted:
        acceptance = folder
    location = os.path.join(directory, folder)
    write_schema(location, schema)
    for split, stats in statistics.items():
        write_statistics(os.path.join(location, f"Split-{split}"), stats)
    record = {"folder": folder, "splits": sorted(statistics), "written_at": now.isoformat(timespec="seconds"),
              "source": source, "accepted": accepted, "acceptance": acceptance}
    with tf.io.gfile.GFile(os.path.join(location, RECORD_FILE), "w") as f:
        f.write(json.dumps(record, indent=2))
    current = os.path.join(directory, CURRENT_FILE)
    staged = f"{current}.tmp-{uuid.uuid4().hex[:8]}"
    with tf.io.gfile.GFile(staged, "w") as f:
        f.write(json.dumps(record, indent=2))
    tf.io.gfile.rename(staged, current, overwrite=True)
    return location
