"""A CSV file to GZIP TFRecords of tf.Examples, split train/eval by a hash of each row like
ExampleGen's default 2:1, so `loopline train` can iterate without running the pipeline."""
from __future__ import annotations

import csv
import hashlib
import io
import os

import tensorflow as tf


def _feature(value: str, numeric: bool) -> tf.train.Feature:
    if value == "":
        return None
    if numeric:
        return tf.train.Feature(float_list=tf.train.FloatList(value=[float(value)]))
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))


def csv_to_tfrecords(csv_path: str, out_dir: str) -> tuple[str, str]:
    """Writes `<out_dir>/{train,eval}/data.tfrecord.gz`; returns the two file patterns."""
    with tf.io.gfile.GFile(csv_path, "r") as f:  # the CSV may be on gs://...
        rows = list(csv.DictReader(io.StringIO(f.read(), newline="")))
    if not rows:
        raise ValueError(f"{csv_path}: no data rows")
    numeric = {}
    for name in rows[0]:
        values = [r[name] for r in rows if r[name] != ""]
        try:
            [float(v) for v in values]
            numeric[name] = True
        except ValueError:
            numeric[name] = False
    paths = {}
    writers = {}
    for split in ("train", "eval"):
        tf.io.gfile.makedirs(os.path.join(out_dir, split))
        paths[split] = os.path.join(out_dir, split, "data.tfrecord.gz")
        writers[split] = tf.io.TFRecordWriter(paths[split], options="GZIP")
    for line, row in enumerate(rows, start=2):
        features = {}
        for name, value in row.items():
            try:
                feature = _feature(value.strip(), numeric[name])
            except ValueError:
                raise ValueError(f"{csv_path}:{line}: column '{name}' holds {value!r}, not a number") from None
            if feature is not None:
                features[name] = feature
        bucket = int(hashlib.md5(",".join(row.values()).encode()).hexdigest(), 16) % 3
        example = tf.train.Example(features=tf.train.Features(feature=features))
        writers["eval" if bucket == 2 else "train"].write(example.SerializeToString())
    for writer in writers.values():
        writer.close()
    return paths["train"], paths["eval"]
