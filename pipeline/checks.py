"""Checks run before any pipeline work, so a newcomer's mistakes cost one clear line."""
from __future__ import annotations

import csv
import os

from pipeline.config import ConfigError, LooplineConfig


def check_data(config: LooplineConfig) -> list[str]:
    """Returns the CSV's columns; raises ConfigError naming the problem and the file."""
    path = config.data.path
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
