"""The validation rows: carved from the train split to pick the weights to export and to stop
early, never trained on, so the eval split the Evaluator blesses with plays no part in training.

A record is held out when a salted hash of its serialized bytes falls below
`trainer.validation_fraction`: the same rows on every run and every resume, whether the split is
held in memory or streamed, and independent of ExampleGen's own train/eval hash (another salt,
another function). Under MIN_ROWS held-out rows nothing is carved and the eval split is used,
with one log line.
"""
from __future__ import annotations

import tensorflow as tf

SALT = "loopline/validation/"
BUCKETS = 10_000
MIN_ROWS = 50
VALIDATION, EVAL = "validation", "eval"  # the split that selects the weights


@tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
def held_out(serialized: tf.Tensor, fraction: float) -> tf.Tensor:
    """For a `[n]` batch of serialized records, whether each one is a validation row."""
    if fraction <= 0:
        return tf.zeros_like(serialized, dtype=tf.bool)
    return held_out_buckets(bucket(serialized), fraction)


@tf.autograph.experimental.do_not_convert
def bucket(serialized: tf.Tensor) -> tf.Tensor:
    """Each serialized record's bucket (int64, 0 to BUCKETS - 1): held out below the fraction's share."""
    return tf.strings.to_hash_bucket_fast(tf.strings.join([SALT, serialized]), BUCKETS)


def held_out_buckets(buckets: tf.Tensor, fraction: float) -> tf.Tensor:
    """`held_out` from the records' buckets (`bucket`), for records whose buckets were kept."""
    return buckets < int(round(fraction * BUCKETS))


def training_buckets(buckets: tf.Tensor, fraction: float) -> tf.Tensor:
    """Whether each record (by its kept bucket) is trained on: not `held_out_buckets`."""
    return tf.logical_not(held_out_buckets(buckets, fraction))


def training_rows(serialized: tf.Tensor, fraction: float) -> tf.Tensor:
    """The records of a `[n]` batch that are trained on."""
    return tf.boolean_mask(serialized, training_buckets(bucket(serialized), fraction))


def validation_rows(serialized: tf.Tensor, fraction: float) -> tf.Tensor:
    return tf.boolean_mask(serialized, held_out(serialized, fraction))


def enough(rows: int, fraction: float) -> bool:
    """Whether `rows` held-out rows are a validation split worth selecting on."""
    return fraction > 0 and rows >= MIN_ROWS
