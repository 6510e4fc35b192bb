"""The generic model's linear part: a linear model on the encoded features, fitted exactly on the
trained rows before the loop and frozen; the network beside it learns what it leaves.

On a few hundred rows, stochastic gradients land a linear model a few rows away from its optimum
(docs/model-quality.md: 0.930 to 0.971 across seeds where the optimum reaches 0.971), and the best
epoch is chosen on a few dozen validation rows. Fitted exactly (scikit-learn's LogisticRegression
or Ridge, an L2 penalty of C = 0.1), the linear part is the same on every run; the network's
output layer starts at zero, so the model starts as that linear model and the validation rows pick
how far the network moves from it (a combined actuarial neural network, Wüthrich and Merz, 2019).

Its inputs are the encoder's columns (standardized numbers, missing indicators, one-hot text), for
each number whose trained values are not negative and have a right tail the log makes more
symmetric the standardized log(1 + x) (a multiplicative effect is linear in the log), and each
text column of many values (the encoder's lookups, which the network embeds) one-hot, as
scikit-learn's OneHotEncoder would: in the model a frozen table of one row of logits per value
(`LinearLookups`), zero for a missing or unseen value.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field

import keras
import numpy as np
import tensorflow as tf

from trainer.heads import CLASSIFICATION, Head

log = logging.getLogger("loopline.trainer")

MAX_ROWS = 200_000  # the trained rows it is fitted on at most (the first ones): a few seconds
# And at most this many encoded values (rows x the encoder's columns, 160 MB in float64): a table of
# wide rows (an image's pixels) is fitted on fewer rows.
MAX_VALUES = 20_000_000
# scikit-learn's C (Ridge's alpha is 1 / C): ten times the baselines' penalty. At C = 1 the linear
# part fits a table like digits so confidently that the network's gradients find little to add
# (0.970 there on 3 seeds, the linear model's figure; the network alone reached 0.980); at 0.1, 0.981.
PENALTY = 0.1
SKEWED = 0.5  # a column's skewness over which the log of it is added (when it makes it more symmetric)
# A lookup column's one-hot value in the fit, so its coefficients are penalized as scikit-learn's
# default C = 1 would (PENALTY * ONE_HOT_SCALE**2 = 1): a value seen on a few rows (a family name
# among 300) keeps its effect. On the bench's survival table (its family column), over five splits
# of 3 seeds: 0.703 at scale 1, 0.714 at sqrt(10); LogisticRegression with OneHotEncoder 0.718.
ONE_HOT_SCALE = (1.0 / PENALTY) ** 0.5


@dataclass
class LinearFit:
    """What `fit` found: the inputs' layout and each head's kernel and bias (by head name)."""

    width: int  # the encoder's columns LinearInputs reads (the lookup indices after them: LinearLookups)
    log_columns: list[int] = field(default_factory=list)  # encoder columns (z-scores) whose log is added
    means: list[float] = field(default_factory=list)  # to undo the z-score: x = z * std + mean
    stds: list[float] = field(default_factory=list)
    log_means: list[float] = field(default_factory=list)  # to standardize log(1 + x)
    log_stds: list[float] = field(default_factory=list)
    weights: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    lookup_sizes: list[int] = field(default_factory=list)  # each lookup column's vocabulary, in the encoder's order
    # Per head, the lookups' logits: [sum(size + 1 for each lookup), outputs], each lookup's row 0 (unseen) zero.
    lookup_weights: dict[str, np.ndarray] = field(default_factory=dict)


@keras.saving.register_keras_serializable(package="loopline")
class LinearInputs(keras.layers.Layer):
    """The encoder's first `width` columns, then the standardized log(1 + x) of `log_columns`
    (x rebuilt from its z-score; a missing value, z = 0, reads as the mean)."""

    def __init__(self, width: int, log_columns=(), means=(), stds=(), log_means=(), log_stds=(), **kwargs):
        super().__init__(**kwargs)
        self.width, self.log_columns = int(width), [int(c) for c in log_columns]
        self.means, self.stds = [float(v) for v in means], [float(v) for v in stds]
        self.log_means, self.log_stds = [float(v) for v in log_means], [float(v) for v in log_stds]

    def call(self, x):
        x = tf.cast(x, tf.float32)
        base = x[:, : self.width]
        if not self.log_columns:
            return base
        raw = tf.gather(x, self.log_columns, axis=1) * self.stds + self.means
        # log(1 + x), not log1p: TFLite's builtins have LOG.
        logged = (tf.math.log(1.0 + tf.maximum(raw, 0.0)) - self.log_means) / self.log_stds
        return tf.concat([base, logged], axis=-1)

    def get_config(self):
        return {**super().get_config(), "width": self.width, "log_columns": self.log_columns, "means": self.means,
                "stds": self.stds, "log_means": self.log_means, "log_stds": self.log_stds}


@keras.saving.register_keras_serializable(package="loopline")
class LinearLookups(keras.layers.Layer):
    """A head's linear logits of the encoder's lookup columns (the `len(sizes)` index columns after
    the first `width`): one frozen row per value, summed over the columns; index 0, a missing or
    unseen value, reads its column's zero row. Its input is not cast to a 16-bit policy, which
    would round the indices."""

    def __init__(self, width: int, sizes, outputs: int, **kwargs):
        super().__init__(**{**kwargs, "autocast": False, "trainable": False})
        self.width, self.sizes, self.outputs = int(width), [int(size) for size in sizes], int(outputs)
        self.offsets = np.cumsum([0, *[size + 1 for size in self.sizes[:-1]]]).astype(np.int32)

    def build(self, input_shape):
        self.table = self.add_weight(shape=(sum(self.sizes) + len(self.sizes), self.outputs), initializer="zeros",
                                     trainable=False, name="table")

    def call(self, x):
        indices = tf.cast(tf.round(x[:, self.width:self.width + len(self.sizes)]), tf.int32) + self.offsets
        return tf.reduce_sum(tf.gather(self.table, indices), axis=1)

    def get_config(self):
        return {**super().get_config(), "width": self.width, "sizes": self.sizes, "outputs": self.outputs}


def inputs_of(fit: LinearFit) -> LinearInputs:
    return LinearInputs(fit.width, fit.log_columns, fit.means, fit.stds, fit.log_means, fit.log_stds,
                        dtype="float32", name="linear_inputs")


def fit(encoder, columns: dict[str, tf.Tensor], heads: list[Head]) -> LinearFit | None:
    """The linear part fitted on the held training `columns` (at most MAX_ROWS of them, fewer for
    wide rows: MAX_VALUES): the encoder's output, its log columns, a model per head; None (logged)
    when no head can be fitted."""
    names = {*encoder.numbers, *encoder.strings, *encoder.lookups}
    encoded_width = int(encoder({name: columns[name][:1] for name in names}).shape[1])
    rows = min(int(tf.shape(next(iter(columns.values())))[0]), MAX_ROWS, max(MAX_VALUES // encoded_width, 1))
    features = {name: columns[name][:rows] for name in names}
    encoded = np.concatenate([encoder(batch).numpy() for batch in _batches(features, rows)])
    width = encoded_width - len(encoder.lookups)  # each lookup is one index column, last
    layout = _log_layout(encoded[:, :width], _scalar_numbers(encoder.numbers, features))
    part = LinearFit(width=width, lookup_sizes=[len(v) for v in encoder.lookups.values()], **layout)
    matrix = inputs_of(part)(encoded).numpy().astype(np.float64)
    dense = matrix.shape[1]
    if part.lookup_sizes:
        matrix = _with_one_hot(matrix, encoded[:, width:], part.lookup_sizes)
    for head in heads:
        target = head.encode_label(columns[head.name][:rows]).numpy()
        fitted = _fit_head(head, matrix, target)
        if fitted is not None:
            kernel, bias = fitted
            part.weights[head.name] = kernel[:dense], bias
            if part.lookup_sizes:
                part.lookup_weights[head.name] = _lookup_table(kernel[dense:], part.lookup_sizes)
    if not part.weights:
        return None
    log.info("generic model: its linear part fitted on %d trained rows (%d inputs, %d of them log-scaled, %d one-hot "
             "values of %d lookup column(s)), frozen", rows, matrix.shape[1], len(part.log_columns),
             matrix.shape[1] - dense, len(part.lookup_sizes))
    return part


def _with_one_hot(matrix: np.ndarray, indices: np.ndarray, sizes: list[int]):
    """`matrix` and, after it, each lookup column's one-hot (ONE_HOT_SCALE for its value, index i
    at column i - 1; index 0, missing or unseen, all zeros), as one sparse matrix."""
    from scipy import sparse

    indices = np.rint(indices).astype(np.int64)
    starts = np.cumsum([0, *sizes[:-1]])
    rows, cols = np.nonzero(indices > 0)
    one_hot = sparse.csr_matrix((np.full(len(rows), ONE_HOT_SCALE), (rows, starts[cols] + indices[rows, cols] - 1)),
                                shape=(len(indices), sum(sizes)))
    return sparse.hstack([sparse.csr_matrix(matrix), one_hot], format="csr")


def _lookup_table(kernel: np.ndarray, sizes: list[int]) -> np.ndarray:
    """The one-hot columns' kernel rows as `LinearLookups`' table: a zero row (unseen) before each column's values."""
    blocks, start = [], 0
    for size in sizes:
        blocks += [np.zeros((1, kernel.shape[1]), np.float32), kernel[start:start + size] * ONE_HOT_SCALE]
        start += size
    return np.concatenate(blocks).astype(np.float32)


def _batches(features: dict[str, tf.Tensor], rows: int, size: int = 8192):
    for start in range(0, rows, size):
        yield {name: column[start:start + size] for name, column in features.items()}


def _scalar_numbers(numbers: dict, features: dict) -> dict[str, tuple[int, float, float]]:
    """Each one-value number column's (z-score column in the encoder's output, mean, std): the
    encoder writes each number column's values, then its missing indicators, in name order."""
    out, position = {}, 0
    for name, (mean, std) in sorted(numbers.items()):
        values = int(np.prod(features[name].shape[1:]))
        if values == 1:
            out[name] = (position, mean, std)
        position += 2 * values
    return out


def _log_layout(encoded: np.ndarray, number_columns: dict[str, tuple[int, float, float]]) -> dict:
    """Which z-score columns get a log beside them: values never negative (missing rows, z = 0
    with their indicator set, left out), skewness over SKEWED, the log's smaller."""
    layout = {"log_columns": [], "means": [], "stds": [], "log_means": [], "log_stds": []}
    for column, mean, std in number_columns.values():
        present = encoded[:, column + 1] == 0  # the missing indicator follows each z-score
        x = encoded[present, column].astype(np.float64) * std + mean
        if len(x) < 3 or x.min() < 0 or x.std() == 0:
            continue
        logged = np.log1p(x)
        if _skewness(x) <= SKEWED or abs(_skewness(logged)) >= abs(_skewness(x)) or logged.std() == 0:
            continue
        for key, value in zip(layout, (column, mean, std, logged.mean(), logged.std())):
            layout[key].append(value)
    return layout


def _skewness(x: np.ndarray) -> float:
    centred = x - x.mean()
    return float((centred**3).mean() / max(x.std(), 1e-12) ** 3)


def _fit_head(head: Head, matrix: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(kernel, bias) in the head's logits (classification) or standardized units (regression),
    scikit-learn's LogisticRegression or Ridge with C = PENALTY on the labelled rows (`matrix`
    dense, or sparse with one-hot columns)."""
    from sklearn.linear_model import LogisticRegression, Ridge

    if head.kind == CLASSIFICATION:
        labelled = target >= 0
        classes = np.unique(target[labelled])
        if len(classes) < 2:
            log.info("generic model: no linear part for head '%s' (one class in the trained rows)", head.name)
            return None
        with warnings.catch_warnings():  # not converged in max_iter: still the best it found
            warnings.simplefilter("ignore")
            model = LogisticRegression(C=PENALTY, max_iter=1000).fit(matrix[labelled], target[labelled])
        kernel = np.zeros((matrix.shape[1], len(head.vocabulary)), np.float32)
        bias = np.zeros(len(head.vocabulary), np.float32)
        if len(classes) == 2:  # one logit, class 1's against class 0's at zero: a sigmoid as a softmax
            kernel[:, classes[1]], bias[classes[1]] = model.coef_[0], model.intercept_[0]
        else:
            kernel[:, classes], bias[classes] = model.coef_.T, model.intercept_
        return kernel, bias
    labelled = np.isfinite(target)
    standardized = (target[labelled] - head.mean) / head.std
    model = Ridge(alpha=1 / PENALTY).fit(matrix[labelled], standardized)
    return model.coef_.reshape(-1, 1).astype(np.float32), np.array([model.intercept_], np.float32)


def head_output(head: Head, hidden: tf.Tensor, encoded: tf.Tensor, linear_inputs: tf.Tensor,
                part: LinearFit) -> tf.Tensor:
    """The head's output from its frozen linear logits (of `linear_inputs`, and of the lookups in
    `encoded`) plus the network's, whose layer starts at zero; in float32, named as
    `Head.output_layer` names it."""
    kernel, bias = part.weights[head.name]
    frozen = keras.layers.Dense(kernel.shape[1], trainable=False, dtype="float32", name=f"{head.name}_linear")
    parts = [frozen(linear_inputs)]
    frozen.set_weights([kernel, bias])
    if head.name in part.lookup_weights:
        lookups = LinearLookups(part.width, part.lookup_sizes, kernel.shape[1], dtype="float32",
                                name=f"{head.name}_linear_lookups")
        parts.append(lookups(encoded))
        lookups.set_weights([part.lookup_weights[head.name]])
    network = keras.layers.Dense(kernel.shape[1], kernel_initializer="zeros", dtype="float32",
                                 name=f"{head.name}_network")(hidden)
    total = keras.layers.Add(dtype="float32", name=f"{head.name}_logits")([*parts, network])
    if head.kind == CLASSIFICATION:
        return keras.layers.Activation("softmax", dtype="float32", name=head.name)(total)
    return keras.layers.Rescaling(head.std, offset=head.mean, dtype="float32", name=head.name)(total)
