"""tf.data input over ExampleGen's GZIP TFRecord splits: files interleaved in parallel, batched
then parsed (one parse call per batch, not per example), labels encoded, prefetched."""
from __future__ import annotations

import tensorflow as tf

from trainer.features import FeatureKinds, parse_examples
from trainer.heads import Head


def record_dataset(file_pattern: str, deterministic: bool = True) -> tf.data.Dataset:
    files = tf.io.gfile.glob(file_pattern)
    if not files:
        raise FileNotFoundError(f"no TFRecord files match {file_pattern}")
    return tf.data.Dataset.from_tensor_slices(sorted(files)).interleave(
        lambda path: tf.data.TFRecordDataset(path, compression_type="GZIP"),
        cycle_length=min(len(files), 4),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic,
    )


def make_dataset(
    file_pattern: str,
    kinds: FeatureKinds,
    heads: list[Head],
    batch_size: int,
    shuffle: bool = False,
    seed: int | None = None,
    cache: bool = True,
) -> tf.data.Dataset:
    """Yields (features, targets) with features `{name: [batch, 1]}` and targets `{head: [batch]}`.

    `kinds` must include the label columns; they are split off into targets.
    """
    labels = {head.name for head in heads}

    def split(serialized):
        parsed = parse_examples(serialized, kinds)
        features = {k: v for k, v in parsed.items() if k not in labels}
        targets = {head.name: head.encode_label(parsed[head.name]) for head in heads}
        return features, targets

    dataset = record_dataset(file_pattern)
    if cache:
        dataset = dataset.cache()
    if shuffle:
        dataset = dataset.shuffle(10_000, seed=seed, reshuffle_each_iteration=True)
    return dataset.batch(batch_size).map(split, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def parsed_batches(file_pattern: str, kinds: FeatureKinds, batch_size: int = 1024):
    """Parsed raw columns as NumPy, for statistics."""
    dataset = record_dataset(file_pattern).batch(batch_size).map(lambda s: parse_examples(s, kinds))
    return dataset.as_numpy_iterator()
