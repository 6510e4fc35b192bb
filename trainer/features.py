"""Feature handling shared by training and serving: the raw feature kinds, parsing serialized
tf.Examples into `[batch, 1]` tensors, training-split statistics, and the encoder layer.

Numbers travel as float32 with NaN for a missing value (an infinite one counts as missing too);
strings as tf.string with "" for missing. The encoder turns them into one dense vector with
constants only (no lookup tables), so the same graph converts to TFLite builtins.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import keras
import numpy as np
import tensorflow as tf

log = logging.getLogger("loopline.trainer")

# The stored dtype of each feature in the tf.Examples: "int64", "float32" or "string".
FeatureKinds = dict[str, str]

MAX_VOCABULARY = 100


def is_number(kind: str) -> bool:
    return kind in ("int64", "float32")


def infer_feature_kinds(file_pattern: str, max_records: int = 1000) -> FeatureKinds:
    """Reads a sample of GZIP TFRecords and returns each feature's stored dtype."""
    files = tf.io.gfile.glob(file_pattern)
    if not files:
        raise FileNotFoundError(f"no TFRecord files match {file_pattern}")
    kinds: FeatureKinds = {}
    dataset = tf.data.TFRecordDataset(files, compression_type="GZIP").take(max_records)
    for record in dataset.as_numpy_iterator():
        example = tf.train.Example.FromString(record)
        for name, feature in example.features.feature.items():
            which = feature.WhichOneof("kind")
            kind = {"int64_list": "int64", "float_list": "float32", "bytes_list": "string"}.get(which)
            if kind is None:
                continue
            previous = kinds.get(name)
            if previous is None or previous == kind:
                kinds[name] = kind
            elif is_number(previous) and is_number(kind):
                kinds[name] = "float32"
            else:
                raise ValueError(f"feature '{name}' holds both {previous} and {kind} values")
    return dict(sorted(kinds.items()))


def kinds_from_schema(schema) -> FeatureKinds:
    """Feature kinds from a tensorflow-metadata Schema: INT -> int64, FLOAT -> float32,
    BYTES -> string. Features the schema marks deprecated are left out."""
    from tensorflow_metadata.proto.v0 import schema_pb2

    names = {schema_pb2.INT: "int64", schema_pb2.FLOAT: "float32", schema_pb2.BYTES: "string"}
    kinds: FeatureKinds = {}
    for feature in schema.feature:
        if feature.lifecycle_stage == schema_pb2.DEPRECATED:
            continue
        if feature.type not in names:
            raise ValueError(f"schema: feature '{feature.name}' has type "
                             f"{schema_pb2.FeatureType.Name(feature.type)}; expected INT, FLOAT or BYTES")
        kinds[feature.name] = names[feature.type]
    return dict(sorted(kinds.items()))


def parse_examples(serialized: tf.Tensor, kinds: FeatureKinds) -> dict[str, tf.Tensor]:
    """Parses a batch of serialized tf.Examples into `[batch, 1]` tensors per feature."""
    spec = {
        name: tf.io.RaggedFeature(tf.string if kind == "string" else tf.as_dtype(kind))
        for name, kind in kinds.items()
    }
    parsed = tf.io.parse_example(serialized, spec)
    out = {}
    for name, kind in kinds.items():
        values = parsed[name]
        if kind == "string":
            out[name] = values.to_tensor(default_value="", shape=[None, 1])
        else:
            out[name] = tf.cast(values, tf.float32).to_tensor(default_value=math.nan, shape=[None, 1])
    return out


@dataclass
class FeatureStats:
    """What the encoder needs of the training split: mean/std per number, vocabulary per string."""

    numbers: dict[str, tuple[float, float]] = field(default_factory=dict)
    strings: dict[str, list[str]] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)
    count: int = 0

    def to_json(self) -> dict:
        return {"numbers": self.numbers, "strings": self.strings, "missing": self.missing, "count": self.count}

    @classmethod
    def from_json(cls, data: dict) -> "FeatureStats":
        return cls(
            numbers={k: tuple(v) for k, v in data["numbers"].items()},
            strings=data["strings"],
            missing=data.get("missing", {}),
            count=data.get("count", 0),
        )


def compute_stats(batches, kinds: FeatureKinds) -> FeatureStats:
    """One pass over parsed batches (dicts of `[batch, 1]` arrays)."""
    sums = {n: 0.0 for n, k in kinds.items() if is_number(k)}
    squares = dict(sums)
    present = {n: 0 for n in kinds}
    counts: dict[str, dict[str, int]] = {n: {} for n, k in kinds.items() if k == "string"}
    infinite = {n: 0 for n in sums}
    total = 0
    for batch in batches:
        size = next(iter(batch.values())).shape[0]
        total += size
        for name, kind in kinds.items():
            values = np.asarray(batch[name]).reshape(-1)
            if is_number(kind):
                ok = values[np.isfinite(values)].astype(np.float64)
                infinite[name] += int(np.isinf(values).sum())
                sums[name] += ok.sum()
                squares[name] += (ok**2).sum()
                present[name] += ok.size
            else:
                for value in values:
                    if value:
                        text = value.decode() if isinstance(value, bytes) else str(value)
                        counts[name][text] = counts[name].get(text, 0) + 1
                        present[name] += 1
    bad = {name: n for name, n in infinite.items() if n}
    if bad:
        log.warning("infinite values (counted as missing, like NaN): %s", bad)
    stats = FeatureStats(count=total)
    for name in sums:
        n = max(present[name], 1)
        mean = sums[name] / n
        var = max(squares[name] / n - mean**2, 0.0)
        stats.numbers[name] = (float(mean), float(math.sqrt(var)) or 1.0)
    for name, seen in counts.items():
        ranked = sorted(seen, key=lambda v: (-seen[v], v))
        stats.strings[name] = ranked[:MAX_VOCABULARY]
    stats.missing = {name: total - present[name] for name in kinds}
    return stats


@keras.saving.register_keras_serializable(package="loopline")
class TabularEncoder(keras.layers.Layer):
    """Numbers: standardized, NaN -> 0 plus a missing indicator. Strings: one-hot over the
    training vocabulary (an unseen or missing value is all zeros)."""

    def __init__(self, numbers: dict, strings: dict, **kwargs):
        super().__init__(**kwargs)
        self.numbers = {k: tuple(v) for k, v in numbers.items()}
        self.strings = {k: list(v) for k, v in strings.items()}

    def call(self, features):
        parts = []
        for name, (mean, std) in sorted(self.numbers.items()):
            x = tf.cast(features[name], tf.float32)
            # NaN (missing) and +-inf both read as missing: one inf must not turn every answer into
            # NaN. (Not `!(abs(x) < inf)`: Grappler and the TFLite converter rewrite that to
            # `abs(x) >= inf`, which lets NaN through.)
            missing = tf.logical_not(tf.math.is_finite(x))
            z = tf.where(missing, tf.zeros_like(x), (x - mean) / std)
            parts += [z, tf.cast(missing, tf.float32)]
        for name, vocabulary in sorted(self.strings.items()):
            x = features[name]
            parts.append(tf.cast(tf.equal(x, tf.constant(vocabulary, tf.string)[tf.newaxis, :]), tf.float32))
        return tf.concat(parts, axis=-1)

    def get_config(self):
        return {**super().get_config(), "numbers": self.numbers, "strings": self.strings}
