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
    import tensorflow as tf

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
