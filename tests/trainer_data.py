"""Small GZIP TFRecord splits for trainer tests, written without TFX."""
from __future__ import annotations

import numpy as np
import tensorflow as tf


def write_examples(path, columns: dict[str, np.ndarray]) -> str:
    """One tf.Example per row; float columns as float_list, str columns as bytes_list."""
    names = list(columns)
    rows = len(columns[names[0]])
    with tf.io.TFRecordWriter(str(path), options="GZIP") as writer:
        for i in range(rows):
            feature = {}
            for name in names:
                value = columns[name][i]
                if isinstance(value, str):
                    feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
                else:
                    feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(value)]))
            # Deterministic bytes (map entries sorted): the validation rows are picked by a hash of a
            # record's bytes, so the same data must hold out the same rows in every test process.
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString(deterministic=True))
    return str(path)


def regression_splits(folder, rows: int = 512, seed: int = 0, inf_every: int = 0) -> tuple[str, str]:
    """y = x . w + noise over 4 numeric features; `inf_every` puts +inf in x0 of every Nth row."""
    rng = np.random.default_rng(seed)
    paths = []
    for split, n in (("train", rows), ("eval", rows // 4)):
        x = rng.normal(size=(n, 4)).astype(np.float32)
        y = x @ np.array([1.5, -2.0, 0.5, 1.0], np.float32) + 0.1 * rng.normal(size=n).astype(np.float32)
        if inf_every and split == "train":
            x[::inf_every, 0] = np.inf
        columns = {f"x{i}": x[:, i] for i in range(4)} | {"target": y}
        (folder / split).mkdir(parents=True, exist_ok=True)
        paths.append(write_examples(folder / split / "data.gz", columns))
    return paths[0], paths[1]


def trained_rows(file_pattern: str, fraction: float = 0.2) -> int:
    """Rows of a split the trainer trains on: the ones trainer.holdout does not hold out for
    validation (at trainer.validation_fraction's default)."""
    from trainer import holdout

    records = tf.constant(list(tf.data.TFRecordDataset(tf.io.gfile.glob(file_pattern), compression_type="GZIP")
                               .as_numpy_iterator()))
    return int(tf.size(holdout.training_rows(records, fraction)))


def points_splits(folder, rows: int = 1024, center=(3.0, -2.0)) -> tuple[str, str]:
    rng = np.random.default_rng(1)
    paths = []
    for split, n in (("train", rows), ("eval", 64)):
        xy = rng.normal(size=(n, 2)).astype(np.float32) * 0.3 + np.array(center, np.float32)
        (folder / split).mkdir(parents=True, exist_ok=True)
        paths.append(write_examples(folder / split / "data.gz", {"x": xy[:, 0], "y": xy[:, 1]}))
    return paths[0], paths[1]


def read_events(folder) -> dict[str, list[float]]:
    """Tag -> scalar values (or histogram counts summed), read with TensorBoard's own event
    reader (the one its scalars and histograms plugins use)."""
    from tensorboard.backend.event_processing import plugin_event_accumulator

    accumulator = plugin_event_accumulator.EventAccumulator(str(folder), size_guidance={"tensors": 0})
    accumulator.Reload()
    tags: dict[str, list] = {}
    for tag in accumulator.Tags()["tensors"]:
        for event in accumulator.Tensors(tag):
            array = tf.make_ndarray(event.tensor_proto)
            tags.setdefault(tag, []).append(float(array) if array.ndim == 0 else float(array[:, 2].sum()))
    return tags


def plugin_tags(folder) -> dict[str, list[str]]:
    """TensorBoard plugin name -> tags it would show, for the event files under `folder`."""
    from tensorboard.backend.event_processing import plugin_event_accumulator

    accumulator = plugin_event_accumulator.EventAccumulator(str(folder))
    accumulator.Reload()
    plugins = set(accumulator.ActivePlugins())
    return {plugin: sorted(accumulator.PluginTagToContent(plugin)) if plugin in plugins else []
            for plugin in ("scalars", "histograms")}


def binary_splits(folder, rows: int = 1024, seed: int = 2) -> tuple[str, str]:
    """label "pos"/"neg" from a noisy linear score of 4 numeric features (AUC well below 1)."""
    rng = np.random.default_rng(seed)
    paths = []
    for split, n in (("train", rows), ("eval", rows // 2)):
        x = rng.normal(size=(n, 4)).astype(np.float32)
        score = x @ np.array([1.0, -1.0, 0.5, 0.0], np.float32) + 1.2 * rng.normal(size=n)
        columns = {f"x{i}": x[:, i] for i in range(4)} | {"label": np.where(score > 0, "pos", "neg")}
        (folder / split).mkdir(parents=True, exist_ok=True)
        paths.append(write_examples(folder / split / "data.gz", columns))
    return paths[0], paths[1]
