"""Checks run before any pipeline work, so a newcomer's mistakes cost one clear line."""
from __future__ import annotations

import csv
import os

from pipeline.config import ConfigError, LooplineConfig


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
    if not os.path.isfile(path):
        raise ConfigError(f"data.path: no such file: {path}")
    with open(path, newline="") as f:
        header = next(csv.reader(f), None)
    if not header or not any(h.strip() for h in header):
        raise ConfigError(f"data.path: {path} is empty or has no header row")
    columns = [h.strip() for h in header]
    if len(set(columns)) != len(columns):
        dupes = sorted({c for c in columns if columns.count(c) > 1})
        raise ConfigError(f"data.path: {path} has duplicate columns {dupes}")
    if config.data.label not in columns:
        raise ConfigError(f"data.label: column '{config.data.label}' is not in {path}; columns are {columns}")
    if config.data.eval_path is not None and not os.path.isfile(config.data.eval_path):
        raise ConfigError(f"data.eval_path: no such file: {config.data.eval_path}")
    if config.data.schema is not None and not os.path.isfile(config.data.schema):
        raise ConfigError(f"data.schema: no such file: {config.data.schema}")
    return columns
