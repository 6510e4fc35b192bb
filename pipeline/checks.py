"""Checks run before any pipeline work, so a newcomer's mistakes cost one clear line."""
from __future__ import annotations

import codecs
import os

from ingestion.csv_options import SNIFF_BYTES, CsvError, CsvOptions, parse_header
from pipeline.config import ConfigError, DataSection, LooplineConfig


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


def _csv_header(key: str, path: str, options: CsvOptions, stock: bool) -> list[str]:
    """The columns of the CSV file(s) at `path`, read by the CSV readers' own header rule; every
    file of a glob must have the same header."""
    import tensorflow as tf

    columns, first = None, None
    for file in _csv_files(key, path):
        with tf.io.gfile.GFile(file, "rb") as f:
            sample = f.read(SNIFF_BYTES + 1)
        if stock and sample.startswith(codecs.BOM_UTF8):
            raise ConfigError(f"{key}: {file} starts with a UTF-8 byte-order mark, which data.example_gen stock "
                              "(TFX's CsvExampleGen) keeps in the first column's name; use data.example_gen arrow")
        try:
            found, _ = parse_header(file, sample[:SNIFF_BYTES], len(sample) <= SNIFF_BYTES, options)
        except CsvError as exc:
            raise ConfigError(f"{key}: {exc}") from None
        if columns is not None and found != columns:
            raise ConfigError(f"{key}: {file} has columns {found}, but {first} has {columns}; "
                              "the files of one table need the same header")
        columns, first = columns or found, first or file
    return columns


def check_stock_options(data: DataSection) -> None:
    """data.example_gen stock reads a CSV by TFX's own rule (',' between cells, UTF-8, only an empty
    cell missing): a CSV option it cannot honour is refused, naming the key."""
    if data.format != "csv" or data.example_gen != "stock":
        return
    refused = {"na_values": data.na_values not in (None, [""]), "delimiter": data.delimiter != ",",
               "encoding": not data.csv_options().is_utf8}
    for key, bad in refused.items():
        if bad:
            raise ConfigError(f"data.{key}: data.example_gen stock (TFX's CsvExampleGen) reads ',' delimited UTF-8 "
                              f"with only an empty cell missing, not data.{key} {getattr(data, key)!r}; remove "
                              f"data.{key} or use data.example_gen arrow")


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
    check_stock_options(config.data)
    options = config.data.csv_options()
    stock = config.data.example_gen == "stock"
    columns = _csv_header("data.path", path, options, stock)
    if config.data.label not in columns:
        raise ConfigError(f"data.label: column '{config.data.label}' is not in {path}; columns are {columns}")
    if config.data.eval_path is not None:
        _csv_header("data.eval_path", config.data.eval_path, options, stock)
    if config.data.schema is not None and not _is_file(config.data.schema):
        raise ConfigError(f"data.schema: no such file: {config.data.schema}")
    return columns
