"""Checks run before any pipeline work, so a newcomer's mistakes cost one clear line."""
from __future__ import annotations

import csv
import io

from pipeline.config import ConfigError, LooplineConfig


def _is_file(path: str) -> bool:
    import tensorflow as tf  # tf.io.gfile: the path may be gs://...

    return tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path)


def check_data(config: LooplineConfig) -> list[str]:
    """Returns the CSV's columns; raises ConfigError naming the problem and the file."""
    import tensorflow as tf

    path = config.data.path
    if not _is_file(path):
        raise ConfigError(f"data.path: no such file: {path}")
    with tf.io.gfile.GFile(path, "r") as f:
        header = next(csv.reader(io.StringIO(f.readline())), None)
    if not header or not any(h.strip() for h in header):
        raise ConfigError(f"data.path: {path} is empty or has no header row")
    columns = [h.strip() for h in header]
    if len(set(columns)) != len(columns):
        dupes = sorted({c for c in columns if columns.count(c) > 1})
        raise ConfigError(f"data.path: {path} has duplicate columns {dupes}")
    if config.data.label not in columns:
        raise ConfigError(f"data.label: column '{config.data.label}' is not in {path}; columns are {columns}")
    if config.data.eval_path is not None and not _is_file(config.data.eval_path):
        raise ConfigError(f"data.eval_path: no such file: {config.data.eval_path}")
    if config.data.schema is not None and not _is_file(config.data.schema):
        raise ConfigError(f"data.schema: no such file: {config.data.schema}")
    return columns
