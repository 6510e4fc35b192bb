"""Checks run before any pipeline work, so a newcomer's mistakes cost one clear line."""
from __future__ import annotations

import csv
import io
import os

from pipeline.config import ConfigError, LooplineConfig


def _is_file(path: str) -> bool:
    import tensorflow as tf  # tf.io.gfile: the path may be gs://...

    return tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path)


def _check_files(key: str, path: str, data_format: str) -> None:
    """data.path or data.eval_path of a format other than CSV: something to read is there."""
    import tensorflow as tf

    if data_format == "image_folder":
        if not tf.io.gfile.isdir(path) or not tf.io.gfile.glob(os.path.join(path, "*", "*")):
            raise ConfigError(f"{key}: {path} is not a folder of class folders of images (data.format image_folder)")
    elif not tf.io.gfile.glob(path):
        raise ConfigError(f"{key}: no file matches {path} (data.format {data_format})")


def _csv_files(key: str, path: str) -> list[str]:
    """A CSV file, or a glob of CSV files (one table in several files, read in parallel by Beam)."""
    import tensorflow as tf

    if not any(c in path for c in "*?["):
        if not _is_file(path):
            raise ConfigError(f"{key}: no such file: {path}")
        return [path]
    files = sorted(f for f in tf.io.gfile.glob(path) if not tf.io.gfile.isdir(f))
    if not files:
        raise ConfigError(f"{key}: no file matches {path}")
    return files


def _csv_header(key: str, path: str) -> list[str]:
    """The columns of the CSV file(s) at `path`; every file of a glob must have the same header."""
    import tensorflow as tf

    columns, first = None, None
    for file in _csv_files(key, path):
        with tf.io.gfile.GFile(file, "r") as f:
            header = next(csv.reader(io.StringIO(f.readline())), None)
        if not header or not any(h.strip() for h in header):
            raise ConfigError(f"{key}: {file} is empty or has no header row")
        found = [h.strip() for h in header]
        if len(set(found)) != len(found):
            dupes = sorted({c for c in found if found.count(c) > 1})
            raise ConfigError(f"{key}: {file} has duplicate columns {dupes}")
        if columns is not None and found != columns:
            raise ConfigError(f"{key}: {file} has columns {found}, but {first} has {columns}; "
                              "the files of one table need the same header")
        columns, first = columns or found, first or file
    return columns


def check_data(config: LooplineConfig) -> list[str]:
    """Returns the CSV's columns; raises ConfigError naming the problem and the file. Other
    formats: checks there are files (their columns are known once read), returns []."""
    path = config.data.path
    if config.data.format != "csv":
        for key, value in (("data.path", path), ("data.eval_path", config.data.eval_path)):
            if value is not None:
                _check_files(key, value, config.data.format)
        if config.data.format == "image_folder" and config.data.label != "label":
            raise ConfigError(f"data.label: an image_folder's label feature is 'label' (the class folder), "
                              f"not '{config.data.label}'")
        return []
    columns = _csv_header("data.path", path)
    if config.data.label not in columns:
        raise ConfigError(f"data.label: column '{config.data.label}' is not in {path}; columns are {columns}")
    if config.data.eval_path is not None:
        _csv_header("data.eval_path", config.data.eval_path)
    if config.data.schema is not None and not _is_file(config.data.schema):
        raise ConfigError(f"data.schema: no such file: {config.data.schema}")
    return columns
