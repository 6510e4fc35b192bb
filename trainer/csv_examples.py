"""A CSV file to GZIP TFRecords of tf.Examples split train/eval, so `loopline train` can iterate
without running the pipeline. The examples are the pipeline's CSV ExampleGen's: the same reader
and CSV options (ingestion/csv_records.py: names, missing markers, delimiter, encoding, types).
The split is about 2:1 like ExampleGen's default, by a hash of each row's cells (not the same rows:
ExampleGen hashes the serialized example)."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tensorflow as tf

from ingestion import csv_records
from ingestion.csv_options import CsvOptions


def _held_out(batch: pa.RecordBatch) -> np.ndarray:
    """The eval rows: md5 of the row's cells joined by ',' (a missing cell as ''), modulo 3, is 2."""
    rows = pc.binary_join_element_wise(*[pc.fill_null(column, "") for column in batch.columns], pa.scalar(",", pa.large_string()))
    return np.array([int(hashlib.md5(row).hexdigest(), 16) % 3 == 2 for row in rows.cast(pa.large_binary()).to_pylist()], bool)


def csv_to_tfrecords(csv_path: str, out_dir: str, options: CsvOptions = CsvOptions()) -> tuple[str, str]:
    """Writes `<out_dir>/{train,eval}/data.tfrecord.gz`; returns the two file patterns."""
    names, options = csv_records.read_header(csv_path, options)
    types = csv_records.file_types(csv_path, names, options)  # the whole file once, before anything is written
    if not types:
        raise ValueError(f"{csv_path}: no data rows")
    paths = {split: os.path.join(out_dir, split, "data.tfrecord.gz") for split in ("train", "eval")}
    writers = {}
    for split, path in paths.items():  # the work folder may be on gs://...
        tf.io.gfile.makedirs(os.path.dirname(path))
        writers[split] = csv_records.GzipFile(tf.io.gfile.GFile(path, "wb"))
    for batch in csv_records.read_batches(csv_path, names, options):
        records, held_out = csv_records.encode(batch, types), _held_out(batch)
        for split, rows in (("train", ~held_out), ("eval", held_out)):
            writers[split].write(csv_records.split_frames(records.filter(pa.array(rows)), None)[0])
    for writer in writers.values():
        writer.close()
    return paths["train"], paths["eval"]
