"""A CSV file to GZIP TFRecords of tf.Examples split train/eval, so `loopline train` can iterate
without running the pipeline. The examples and the split are the pipeline's CSV ExampleGen's: the
same reader and CSV options (ingestion/csv_records.py: names, missing markers, delimiter, encoding,
types) and its default split, 2:1 by a hash of each serialized example."""
from __future__ import annotations

import os

import tensorflow as tf

from ingestion import csv_records
from ingestion.csv_options import CsvOptions

SPLITS = ("train", "eval")
BUCKETS = [2, 3]  # ExampleGen's default output: train 2 hash buckets, eval 1 (cumulative ends)


def csv_to_tfrecords(csv_path: str, out_dir: str, options: CsvOptions = CsvOptions()) -> tuple[str, str]:
    """Writes `<out_dir>/{train,eval}/data.tfrecord.gz`; returns the two file patterns."""
    names, options = csv_records.read_header(csv_path, options)
    types = csv_records.file_types(csv_path, names, options)  # the whole file once, before anything is written
    if not types:
        raise ValueError(f"{csv_path}: no data rows")
    paths = {split: os.path.join(out_dir, split, "data.tfrecord.gz") for split in SPLITS}
    writers = {}
    for split, path in paths.items():  # the work folder may be on gs://...
        tf.io.gfile.makedirs(os.path.dirname(path))
        writers[split] = csv_records.GzipFile(tf.io.gfile.GFile(path, "wb"))
    for batch in csv_records.read_batches(csv_path, names, options):
        for split, framed in zip(SPLITS, csv_records.split_frames(csv_records.encode(batch, types), BUCKETS)):
            writers[split].write(framed)
    for writer in writers.values():
        writer.close()
    return paths["train"], paths["eval"]
