"""tf.data input over ExampleGen's GZIP TFRecord splits: files interleaved in parallel, cached,
shuffled, batched then parsed (one parse call per batch, not per example), labels encoded,
prefetched."""
from __future__ import annotations

import tensorflow as tf

from trainer.config import InputConfig
from trainer.features import FeatureKinds, parse_examples
from trainer.heads import Head


def record_dataset(file_pattern: str, config: InputConfig | None = None) -> tf.data.Dataset:
    config = config or InputConfig()
    files = tf.io.gfile.glob(file_pattern)
    if not files:
        raise FileNotFoundError(f"no TFRecord files match {file_pattern}")
    return tf.data.Dataset.from_tensor_slices(sorted(files)).interleave(
        lambda path: tf.data.TFRecordDataset(path, compression_type="GZIP"),
        cycle_length=min(len(files), config.parallel_reads),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=config.deterministic,
    )


def count_records(file_pattern: str) -> int:
    return int(record_dataset(file_pattern).reduce(0, lambda n, _: n + 1))


def _splitter(kinds: FeatureKinds, heads: list[Head]):
    labels = {head.name for head in heads}

    def split(serialized):
        parsed = parse_examples(serialized, kinds)
        features = {k: v for k, v in parsed.items() if k not in labels}
        targets = {head.name: head.encode_label(parsed[head.name]) for head in heads}
        return features, targets

    return split


def _finish(dataset: tf.data.Dataset, config: InputConfig) -> tf.data.Dataset:
    options = tf.data.Options()
    options.deterministic = config.deterministic
    # Shard by element, not by file: ExampleGen writes few files, often fewer than workers.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(options)


def training_stream(
    file_pattern: str,
    kinds: FeatureKinds,
    heads: list[Head],
    batch_size: int,
    config: InputConfig,
    seed: int,
    skip_batches: int = 0,
) -> tf.data.Dataset:
    """An endless stream of full (features, targets) batches, reshuffled each epoch.

    With a fixed seed the stream is the same on every run, so resuming skips the batches a
    checkpoint says were consumed and continues exactly where training stopped. Full batches keep
    shapes static (one XLA compilation, even splits across replicas).
    """
    dataset = record_dataset(file_pattern, config)
    if config.cache:
        dataset = dataset.cache()
    dataset = dataset.shuffle(config.shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    dataset = dataset.batch(batch_size, drop_remainder=True)
    if skip_batches:
        dataset = dataset.skip(skip_batches)
    dataset = dataset.map(_splitter(kinds, heads), num_parallel_calls=tf.data.AUTOTUNE, deterministic=config.deterministic)
    return _finish(dataset, config)


def make_dataset(
    file_pattern: str,
    kinds: FeatureKinds,
    heads: list[Head],
    batch_size: int,
    config: InputConfig | None = None,
) -> tf.data.Dataset:
    """One pass over a split (for evaluation): `(features {name: [batch, 1]}, targets {head: [batch]})`.

    `kinds` must include the label columns; they are split off into targets.
    """
    config = config or InputConfig()
    dataset = record_dataset(file_pattern, config)
    if config.cache:
        dataset = dataset.cache()
    dataset = dataset.batch(batch_size).map(_splitter(kinds, heads), num_parallel_calls=tf.data.AUTOTUNE)
    return _finish(dataset, config)


def parsed_batches(file_pattern: str, kinds: FeatureKinds, batch_size: int = 1024):
    """Parsed raw columns as NumPy, for statistics."""
    dataset = record_dataset(file_pattern).batch(batch_size).map(lambda s: parse_examples(s, kinds))
    return dataset.as_numpy_iterator()
