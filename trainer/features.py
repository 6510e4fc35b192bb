"""Feature handling shared by training and serving: the raw feature kinds, parsing serialized
tf.Examples into dense tensors, training-split statistics, and the encoder layer.

A feature's kind is its stored dtype ("int64", "float32", "string") and its shape:
- "float32": one value per example, parsed to `[batch, 1]`;
- "float32[8,8]": a fixed shape, every example holds 64 values (row-major) -> `[batch, 8, 8]`;
- "string[:5]": a variable-length list of at most 5 values -> `[batch, 5]`, padded as missing;
- "image[28,28,1]": one encoded image (PNG, JPEG, GIF, BMP) per example, decoded to float32
  `[batch, 28, 28, 1]` in [0, 1]; plain "image" (a schema's `image_domain`) takes its size from
  the first image of the data (`resolve_image_shapes`).
An example holding more values than its kind allows (or another count than a fixed shape, or an
image of another size) is an error naming the feature: nothing is cut silently.

Numbers travel as float32 with NaN for a missing value (an infinite one counts as missing too);
strings as tf.string with "" for missing. The encoder turns them into one dense vector with no
weights: numbers standardized (with missing indicators), text of few values one-hot; a text column
of many values (a name, a code) becomes its index in a vocabulary (Keras' StringLookup, whose
hash table converts to TFLite builtins), which the model's `embeddings` layer (`ColumnEmbeddings`)
turns into a learned vector.
"""
from __future__ import annotations

import logging
import math
import re
from collections import Counter
from dataclasses import dataclass, field

import keras
import numpy as np
import tensorflow as tf

from ingestion.images import looks_like_image
from serving.signature_names import signature_name

log = logging.getLogger("loopline.trainer")

# The stored dtype of each feature in the tf.Examples: "int64", "float32" or "string".
FeatureKinds = dict[str, str]

MAX_VOCABULARY = 100  # one-hot values of a list of strings; labels have no cap (data.max_classes)
MAX_ONE_HOT = 30  # a text column with more distinct values goes through a vocabulary lookup and an embedding
MAX_LOOKUP = 10_000  # the vocabulary of such a column: its most frequent values (the others read as unseen)
IMAGE = "image"


@dataclass(frozen=True)
class KindSpec:
    """A kind string taken apart: dtype, per-example shape, and whether it is a list of at most
    `shape[0]` values or an encoded image."""

    dtype: str
    shape: tuple[int, ...] = (1,)
    variable: bool = False

    @property
    def is_image(self) -> bool:
        return self.dtype == IMAGE

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


def kind_spec(kind: str) -> KindSpec:
    match = re.fullmatch(r"(int64|float32|string|image)(?:\[(:?)([0-9, ]*)\])?", kind)
    if not match:
        raise ValueError(f"unknown feature kind {kind!r}")
    dtype, variable, dims = match.groups()
    if dims is None:
        return KindSpec(dtype, () if dtype == IMAGE else (1,))
    shape = tuple(int(d) for d in dims.split(",") if d.strip())
    if not shape or min(shape) < 1 or (variable and len(shape) != 1):
        raise ValueError(f"feature kind {kind!r}: expected [d1,d2,...] or [:max_length] with sizes >= 1")
    return KindSpec(dtype, shape, bool(variable))


def is_number(kind: str) -> bool:
    """Parsed to float32 (numbers, and images once decoded)."""
    return kind_spec(kind).dtype in ("int64", "float32", IMAGE)


def is_scalar(kind: str) -> bool:
    return kind in ("int64", "float32", "string")


def feature_shape(kind: str) -> tuple[int, ...]:
    """The parsed tensor's shape per example."""
    spec = kind_spec(kind)
    if spec.is_image and not spec.shape:
        raise ValueError("an image feature's size is not known yet (resolve_image_shapes)")
    return spec.shape


def kind_from_counts(dtype: str, min_count: int, max_count: int, always_present: bool) -> str:
    """The kind of a feature whose examples hold min_count..max_count values (TFDV's rule for a
    shape: the same count in every example, and the feature in every example)."""
    if max_count <= 1:
        return dtype
    if min_count == max_count and always_present:
        return f"{dtype}[{max_count}]"
    return f"{dtype}[:{max_count}]"


def infer_feature_kinds(file_pattern: str, max_records: int = 1000) -> FeatureKinds:
    """Reads a sample of GZIP TFRecords and returns each feature's kind (dtype and shape; one
    encoded image per example is an "image")."""
    files = tf.io.gfile.glob(file_pattern)
    if not files:
        raise FileNotFoundError(f"no TFRecord files match {file_pattern}")
    dtypes: dict[str, str] = {}
    counts: dict[str, list[int]] = {}
    images: dict[str, bool] = {}
    records = 0
    dataset = tf.data.TFRecordDataset(files, compression_type="GZIP").take(max_records)
    for record in dataset.as_numpy_iterator():
        records += 1
        example = tf.train.Example.FromString(record)
        for name, feature in example.features.feature.items():
            which = feature.WhichOneof("kind")
            kind = {"int64_list": "int64", "float_list": "float32", "bytes_list": "string"}.get(which)
            if kind is None:
                continue
            values = getattr(feature, which).value
            counts.setdefault(name, []).append(len(values))
            if kind == "string" and values:
                images[name] = images.get(name, True) and len(values) == 1 and looks_like_image(values[0])
            previous = dtypes.get(name)
            if previous is None or previous == kind:
                dtypes[name] = kind
            elif is_number(previous) and is_number(kind):
                dtypes[name] = "float32"
            else:
                raise ValueError(f"feature '{name}' holds both {previous} and {kind} values")
    kinds = {}
    for name, dtype in dtypes.items():
        seen = counts[name]
        if dtype == "string" and images.get(name):
            kinds[name] = IMAGE
        else:
            kinds[name] = kind_from_counts(dtype, min(seen), max(seen), len(seen) == records)
    return resolve_image_shapes(dict(sorted(kinds.items())), file_pattern)


def kinds_from_schema(schema) -> FeatureKinds:
    """Feature kinds from a tensorflow-metadata Schema: INT -> int64, FLOAT -> float32,
    BYTES -> string; `image_domain` -> image; `shape` a fixed shape, `value_count.max` > 1 a
    list of at most that many values. Features the schema marks deprecated are left out."""
    from tensorflow_metadata.proto.v0 import schema_pb2

    names = {schema_pb2.INT: "int64", schema_pb2.FLOAT: "float32", schema_pb2.BYTES: "string"}
    kinds: FeatureKinds = {}
    for feature in schema.feature:
        if feature.lifecycle_stage == schema_pb2.DEPRECATED:
            continue
        if feature.type not in names:
            raise ValueError(f"schema: feature '{feature.name}' has type "
                             f"{schema_pb2.FeatureType.Name(feature.type)}; expected INT, FLOAT or BYTES")
        dtype = names[feature.type]
        dims = [d.size for d in feature.shape.dim] if feature.HasField("shape") else []
        if feature.HasField("image_domain"):
            kinds[feature.name] = IMAGE
        elif dims and dims != [1]:
            kinds[feature.name] = f"{dtype}[{','.join(str(d) for d in dims)}]"
        elif not dims and feature.value_count.max > 1:
            kinds[feature.name] = f"{dtype}[:{feature.value_count.max}]"
        else:
            kinds[feature.name] = dtype
    return dict(sorted(kinds.items()))


def resolve_image_shapes(kinds: FeatureKinds, file_pattern: str) -> FeatureKinds:
    """Gives each plain "image" kind the size of the first image found in the records."""
    todo = {name for name, kind in kinds.items() if kind == IMAGE}
    if not todo:
        return kinds
    resolved = dict(kinds)
    files = sorted(tf.io.gfile.glob(file_pattern))
    for record in tf.data.TFRecordDataset(files, compression_type="GZIP").as_numpy_iterator():
        feature = tf.train.Example.FromString(record).features.feature
        for name in sorted(todo):
            values = feature[name].bytes_list.value if name in feature else []
            if values:
                height, width, channels = tf.io.decode_image(values[0], expand_animations=False).shape
                resolved[name] = f"{IMAGE}[{height},{width},{channels}]"
                todo.discard(name)
        if not todo:
            return resolved
    raise ValueError(f"image feature(s) {sorted(todo)}: no image in {file_pattern} to take the size from")


def _checked(condition: tf.Tensor, message: str, value: tf.Tensor) -> tf.Tensor:
    """`value`, computed only after `condition` holds (an InvalidArgumentError with `message` otherwise)."""
    with tf.control_dependencies([tf.debugging.Assert(condition, [message])]):
        return tf.identity(value)


def _decode_images(name: str, values: tf.RaggedTensor, shape: tuple[int, ...]) -> tf.Tensor:
    """One encoded image per example to float32 `[batch, h, w, c]` in [0, 1]; a missing one is zeros."""
    height, width, channels = shape
    blobs = values.to_tensor(default_value="", shape=[None, 1])[:, 0]

    def decode(blob):
        def image():
            pixels = tf.io.decode_image(blob, channels=channels, expand_animations=False)
            size = tf.shape(pixels)[:2]
            ok = tf.reduce_all(tf.equal(size, [height, width]))
            return _checked(ok, f"feature '{name}': an image is not {height}x{width}", tf.cast(pixels, tf.float32) / 255.0)

        return tf.cond(tf.strings.length(blob) > 0, image, lambda: tf.zeros(shape, tf.float32))

    return tf.map_fn(decode, blobs, fn_output_signature=tf.TensorSpec(shape, tf.float32))


@tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
def parse_examples(serialized: tf.Tensor, kinds: FeatureKinds) -> dict[str, tf.Tensor]:
    """Parses a batch of serialized tf.Examples into dense tensors, `[batch] + feature_shape(kind)`,
    keyed by each column's `signature_name` (the name the model and its signatures use)."""
    spec = {name: tf.io.RaggedFeature(value_dtype(kind)) for name, kind in kinds.items()}
    return checked_columns(tf.io.parse_example(serialized, spec), kinds)


def value_dtype(kind: str) -> tf.DType:
    """The dtype of a column's values in a tf.Example (what parse_examples reads them as)."""
    s = kind_spec(kind)
    return tf.string if s.dtype in ("string", IMAGE) else tf.as_dtype(s.dtype)


def checked_columns(parsed: dict[str, tf.RaggedTensor], kinds: FeatureKinds) -> dict[str, tf.Tensor]:
    """Each column's values per example (`[batch, (values)]`, `value_dtype`) as parse_examples'
    dense tensors, after checking that every example holds the values its kind allows."""
    specs = {name: kind_spec(kind) for name, kind in kinds.items()}
    limits = {}  # (values allowed, at most) -> the columns held to it, each with its problem
    for name, s in specs.items():
        if s.is_image:
            limit, problem = (1, True), f"feature '{name}': an example holds more than one image"
        else:
            at_most = s.variable or s.size == 1
            limit = (s.size, at_most)
            problem = (f"feature '{name}' ({kinds[name]}): an example holds more than {s.size} value(s)" if at_most
                       else f"feature '{name}' ({kinds[name]}): an example holds another count than {s.size} values")
        limits.setdefault(limit, []).append((parsed[name], problem))
    out = {}
    # Every output is made after the checks, so no value reaches the model unchecked.
    with tf.control_dependencies([_counts_fit(columns, size, at_most) for (size, at_most), columns in limits.items()]):
        for name, s in specs.items():
            values = parsed[name]
            if s.is_image:
                out[name] = _decode_images(name, values, feature_shape(kinds[name]))
            else:
                dense = (values.to_tensor(default_value="", shape=[None, s.size]) if s.dtype == "string" else
                         tf.cast(values, tf.float32).to_tensor(default_value=math.nan, shape=[None, s.size]))
                out[name] = dense if len(s.shape) == 1 else tf.reshape(dense, [-1, *s.shape])  # [batch, size] already
    return {signature_name(name): value for name, value in out.items()}


def _counts_fit(columns: list[tuple[tf.RaggedTensor, str]], size: int, at_most: bool):
    """One assertion for the columns of one limit, rather than one per column (a served request
    runs every op): every example holds at most `size` values of each (`at_most`), else none or
    exactly `size`. It fails with the problem of each column that breaks it."""
    splits = tf.stack([values.row_splits for values, _ in columns])
    counts = splits[:, 1:] - splits[:, :-1]
    wrong = counts > size if at_most else (counts != 0) & (counts != size)
    failing = tf.reduce_any(wrong, axis=1)
    problems = tf.boolean_mask(tf.constant([problem for _, problem in columns]), failing)
    return tf.debugging.Assert(tf.logical_not(tf.reduce_any(failing)), [problems], summarize=len(columns))


@dataclass
class FeatureStats:
    """What the encoder needs of the training split: mean/std per number, one-hot values per text
    column of few values, a lookup vocabulary per text column of many (most frequent first)."""

    numbers: dict[str, tuple[float, float]] = field(default_factory=dict)
    strings: dict[str, list[str]] = field(default_factory=dict)
    lookups: dict[str, list[str]] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)
    count: int = 0
    classes: dict[str, dict[str, int]] = field(default_factory=dict)  # label -> class -> rows (no cap)
    categorical: list[str] = field(default_factory=list)  # number columns counted as categories (in strings/lookups)

    def to_json(self) -> dict:
        return {"numbers": self.numbers, "strings": self.strings, "lookups": self.lookups, "missing": self.missing,
                "count": self.count, "classes": self.classes, "categorical": self.categorical}

    @classmethod
    def from_json(cls, data: dict) -> "FeatureStats":
        return cls(
            numbers={k: tuple(v) for k, v in data["numbers"].items()},
            strings=data["strings"],
            lookups=data.get("lookups", {}),
            missing=data.get("missing", {}),
            count=data.get("count", 0),
            classes=data.get("classes", {}),
            categorical=data.get("categorical", []),
        )


def class_name(value) -> str | None:
    """A class label as text: strings as they are, integral numbers without a decimal point
    (`Head.encode_label` writes them the same way); None when missing."""
    if isinstance(value, bytes):
        return value.decode() or None
    if isinstance(value, str):
        return value or None
    if not math.isfinite(value):
        return None
    if value != int(value):
        raise ValueError(f"a classification label holds {value}, not a whole number")
    return str(int(value))


def _distinct_counts(column) -> list[tuple]:
    """Each distinct value of a column (a `[batch, ...]` array or tensor) and its count: a text
    tensor's counted by TensorFlow, with no Python object per row; an array's by Counter."""
    if isinstance(column, tf.Tensor) and column.dtype == tf.string:
        distinct, _, counts = tf.unique_with_counts(tf.reshape(column, [-1]))
        return list(zip(distinct.numpy().tolist(), counts.numpy().tolist()))
    return list(Counter(np.asarray(column).reshape(-1).tolist()).items())


def _rows_with_text(column, size: int) -> int:
    """The rows of a text column holding at least one non-empty value."""
    if isinstance(column, tf.Tensor):
        return int(tf.math.count_nonzero(tf.reduce_any(tf.reshape(column, [size, -1]) != b"", axis=1)))
    rows = np.asarray(column).reshape(size, -1)
    return int((rows != b"").any(axis=1).sum()) if rows.dtype == object else 0


def _count_as_classes(distinct, counts: dict[str, int], who: str) -> None:
    """Adds each distinct value's count under its class_name text (a missing value left out); a
    number that is not whole is an error, `who` naming the column."""
    for value, n in distinct:
        try:
            text = class_name(value)
        except ValueError:
            raise ValueError(f"{who} holds {value}, not a whole number") from None
        if text is not None:
            counts[text] = counts.get(text, 0) + n


def compute_stats(batches, kinds: FeatureKinds, classes=(), categorical=()) -> FeatureStats:
    """One pass over parsed batches (dicts of `[batch, ...]` arrays, or of tensors: `column_batches`).
    `classes`: label columns of classification heads, whose every class is counted (numbers too).
    `categorical`: number columns whose values are categories (whole numbers, counted as text like
    classes: "3"), one-hot or looked up as text columns are. Batches and the returned statistics
    are keyed by signature names, as parse_examples gives them."""
    kinds = {signature_name(column): kind for column, kind in kinds.items()}
    classes = [signature_name(column) for column in classes]
    categorical = sorted(signature_name(column) for column in categorical)
    class_counts: dict[str, dict[str, int]] = {n: {} for n in classes}
    sums = {n: 0.0 for n, k in kinds.items() if is_number(k) and n not in categorical}
    squares = dict(sums)
    present = {n: 0 for n in kinds}  # examples with a value
    values_seen = {n: 0 for n in sums}
    counts: dict[str, dict[str, int]] = {n: {} for n, k in kinds.items() if n not in sums}
    infinite = {n: 0 for n in sums}
    total = 0
    for batch in batches:
        size = next(iter(batch.values())).shape[0]
        total += size
        for name, kind in kinds.items():
            column = batch[name]
            # A text column that is also a classification label is counted once for both.
            distinct = _distinct_counts(column) if name in counts or name in class_counts else None
            if name in categorical:
                _count_as_classes(distinct, counts[name], f"feature '{name}' is categorical "
                                  "(trainer.categorical_features or the Transform's schema) but")
                present[name] += int(np.isfinite(np.asarray(column).reshape(size, -1)).any(axis=1).sum())
            elif is_number(kind):
                rows = np.asarray(column).reshape(size, -1)
                values = rows.reshape(-1)
                finite = np.isfinite(values)
                ok = values[finite].astype(np.float64)
                infinite[name] += int(np.isinf(values).sum())
                sums[name] += ok.sum()
                squares[name] += (ok**2).sum()
                values_seen[name] += ok.size
                present[name] += int(np.isfinite(rows).any(axis=1).sum())
            else:
                for value, n in distinct:
                    if value:
                        text = value.decode() if isinstance(value, bytes) else str(value)
                        counts[name][text] = counts[name].get(text, 0) + n
                present[name] += _rows_with_text(column, size)
            if name in class_counts:
                _count_as_classes(distinct, class_counts[name], f"label '{name}': a classification label")
    bad = {name: n for name, n in infinite.items() if n}
    if bad:
        log.warning("infinite values (counted as missing, like NaN): %s", bad)
    stats = FeatureStats(count=total)
    for name in sums:
        n = max(values_seen[name], 1)
        mean = sums[name] / n
        var = max(squares[name] / n - mean**2, 0.0)
        stats.numbers[name] = (float(mean), float(math.sqrt(var)) or 1.0)
    for name, seen in counts.items():
        ranked = sorted(seen, key=lambda v: (-seen[v], v))
        if is_scalar(kinds[name]) and len(ranked) > MAX_ONE_HOT and name not in class_counts:
            stats.lookups[name] = ranked[:MAX_LOOKUP]
            if len(ranked) > MAX_LOOKUP:
                log.warning("feature '%s': %d distinct values; the vocabulary keeps the %d most frequent, the others "
                            "read as unseen", name, len(ranked), MAX_LOOKUP)
            continue
        stats.strings[name] = ranked[:MAX_VOCABULARY]
        if len(ranked) > MAX_VOCABULARY and name not in class_counts:
            rare = sum(seen[v] for v in ranked[MAX_VOCABULARY:])
            log.warning("feature '%s': %d distinct values; the generic encoder one-hot encodes the %d most frequent, "
                        "%d value(s) of the others encode as unseen (all zeros)", name, len(ranked), MAX_VOCABULARY, rare)
    stats.missing = {name: total - present[name] for name in kinds}
    stats.classes = class_counts
    stats.categorical = categorical
    return stats


def _flat(x: tf.Tensor) -> tf.Tensor:
    """`[batch, ...]` to `[batch, values]` (a static width, for the layers after the encoder). Also
    where the shape is already that: a served request may feed a `[batch]` column where `[batch, 1]`
    is declared (TF Serving checks no shapes before the run), and this makes it `[batch, 1]`."""
    return tf.reshape(x, [-1, int(np.prod(x.shape[1:]))])


@keras.saving.register_keras_serializable(package="loopline")
class TabularEncoder(keras.layers.Layer):
    """Numbers: standardized, NaN -> 0 plus a missing indicator. Strings: one-hot over the
    training vocabulary (an unseen or missing value is all zeros). `lookups`: text columns of many
    values, each appended last (in name order) as its index in its vocabulary, 0 for a missing or
    unseen value (for `ColumnEmbeddings`). `categorical`: number columns among `strings` and
    `lookups` (their vocabularies whole numbers as text): compared as numbers, NaN matching none.
    No weights: under XLA it runs in tf.data."""

    def __init__(self, numbers: dict, strings: dict, lookups: dict | None = None, categorical=(), **kwargs):
        super().__init__(**kwargs)
        self.numbers = {k: tuple(v) for k, v in numbers.items()}
        self.strings = {k: list(v) for k, v in strings.items()}
        self.lookups = {k: list(v) for k, v in sorted((lookups or {}).items())}
        self.categorical = sorted(categorical)
        self._lookup_layers = {name: _number_lookup(vocabulary) if name in self.categorical else
                               keras.layers.StringLookup(vocabulary=vocabulary, num_oov_indices=1,
                                                         name=f"{self.name}_lookup_{i}")
                               for i, (name, vocabulary) in enumerate(self.lookups.items())}

    def call(self, features):
        parts = [self._numbers(features)] if self.numbers else []
        for name, vocabulary in sorted(self.strings.items()):
            x = _flat(features[name])  # a list of values: multi-hot (any position holds the value)
            values = tf.constant(vocabulary, tf.string)
            if name in self.categorical:  # codes, compared as the numbers they are
                x, values = tf.cast(x, tf.float32), tf.constant([float(v) for v in vocabulary], tf.float32)
            hits = tf.equal(x[:, :, tf.newaxis], values[tf.newaxis, tf.newaxis, :])
            parts.append(tf.reduce_max(tf.cast(hits, tf.float32), axis=1))
        for name, lookup in self._lookup_layers.items():  # "" (missing) is not in the vocabulary: index 0
            parts.append(tf.cast(lookup(_flat(features[name])), tf.float32))
        return tf.concat(parts, axis=-1)

    def _numbers(self, features) -> tf.Tensor:
        """Each number column standardized, 0 where that is not finite (NaN: missing; +-inf, or a
        value too large to standardize: one inf must not turn every answer into NaN), and then its
        missing indicator, in name order (`[z_a, missing_a, z_b, missing_b, ...]`). Four ops per
        column and five in all, instead of seven per column: a model serving one row pays per op.
        The zeroing stays per column: TFLite's converter moves elementwise ops that all inputs of
        a concatenation share past it, and int8 would then quantize every raw column over one range.
        (Not `!(abs(x) < inf)` for the test: Grappler and the converter rewrite that to
        `abs(x) >= inf`, which lets NaN through.)"""
        values, finite = [], []
        for name, (mean, std) in sorted(self.numbers.items()):
            z = (_flat(tf.cast(features[name], tf.float32)) - mean) / std
            finite.append(tf.math.is_finite(z))
            values.append(tf.where(finite[-1], z, 0.0))
        missing = tf.cast(tf.logical_not(tf.concat(finite, axis=1)), tf.float32)
        both = tf.concat([*values, missing], axis=1)
        if len(values) == 1:
            return both
        return tf.gather(both, _interleaved([int(z.shape[-1]) for z in values]), axis=1)

    def get_config(self):
        return {**super().get_config(), "numbers": self.numbers, "strings": self.strings, "lookups": self.lookups,
                "categorical": self.categorical}


def _number_lookup(vocabulary: list[str]):
    """StringLookup's index (1 + position, 0 for a value not there) for a categorical number
    column, `[batch, 1]` float32: a comparison with every value, not a hash table, because TFLite's
    builtin tables map strings, not numbers. NaN (missing) equals none."""
    values = tf.constant([float(v) for v in vocabulary], tf.float32)
    positions = tf.range(1, len(vocabulary) + 1, dtype=tf.float32)

    def lookup(x: tf.Tensor) -> tf.Tensor:
        hits = tf.cast(tf.equal(x, values[tf.newaxis, :]), tf.float32)
        return tf.reduce_max(hits * positions, axis=1, keepdims=True)

    return lookup


def _interleaved(widths: list[int]) -> np.ndarray:
    """Where each column's values and then its indicators sit in `[all values, all indicators]`."""
    starts = np.cumsum([0, *widths[:-1]])
    total = sum(widths)
    return np.concatenate([np.r_[start:start + width, total + start:total + start + width]
                           for start, width in zip(starts, widths)]).astype(np.int32)


def embedding_size(vocabulary_size: int) -> int:
    """Dimensions of a text column's embedding: grows slowly with its vocabulary, 2 to 16."""
    return int(min(16, max(2, round(2 * vocabulary_size ** 0.25))))


@keras.saving.register_keras_serializable(package="loopline")
class ColumnEmbeddings(keras.layers.Layer):
    """The encoder's output with its last `len(vocabulary_sizes)` columns (vocabulary indices)
    replaced by one learned vector each; index 0 (missing or unseen) is the zero vector, the value
    nothing was learned for. Its input is not cast to a mixed-precision policy's 16-bit type, which
    would round the indices."""

    def __init__(self, vocabulary_sizes: list[int], **kwargs):
        super().__init__(**{**kwargs, "autocast": False})
        self.vocabulary_sizes = list(vocabulary_sizes)
        self.tables = [keras.layers.Embedding(size + 1, embedding_size(size), name=f"{self.name}_{i}")
                       for i, size in enumerate(self.vocabulary_sizes)]

    def call(self, x):
        count = len(self.tables)
        indices = tf.cast(x[:, -count:], tf.int32)
        parts = [tf.cast(x[:, :-count], self.compute_dtype)]
        for j, table in enumerate(self.tables):
            index = indices[:, j]
            parts.append(table(index) * tf.cast(index > 0, self.compute_dtype)[:, tf.newaxis])
        return tf.concat(parts, axis=-1)

    def get_config(self):
        return {**super().get_config(), "vocabulary_sizes": self.vocabulary_sizes}
