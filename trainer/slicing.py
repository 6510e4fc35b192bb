"""Slices of the eval split (TFMA's SlicingSpec: feature_keys / feature_values, plus loopline's
numeric buckets) and their figures, summed in the Evaluator's one streamed pass: the host finds
each row's slices per batch (Slicer.batch), the compiled batch function sums the rows' values per
slice with segment sums (segment_sums), and SliceTotals adds the batches up by slice key."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from trainer.evaluator_config import ALWAYS_CONFUSION_FIGURES, PR_AUC, OperatingPoint, class_figure, micro_figure
from trainer.heads import CLASSIFICATION, Head, HeadTotals

# The per-slice figures in the blessing folder (ModelBlessing's uri), beside blessing.json; the
# model card and the Registrar read it.
SLICES_JSON = "slices.json"
# The TFMA-format evaluation (tfma.load_eval_result reads it), a folder in the blessing folder.
TFMA_FOLDER = "tfma"
# The name of the slice of all examples, as TFMA's tools show it.
OVERALL = "Overall"
# A confusion matrix per slice is kept for classification heads of at most this many classes.
MAX_CONFUSION_CLASSES = 32
CALIBRATION_BINS = 10
# AUC per slice from histograms of each class's probability: the thresholds i / AUC_BUCKETS, as
# TFMA's AUC with num_thresholds = AUC_BUCKETS + 1 places them.
AUC_BUCKETS = 1000

# A slice: its (feature, value as text) pairs sorted by feature, as TFMA orders a slice key; () is Overall.
SliceKey = tuple[tuple[str, str], ...]
_KINDS = {"bytes_list": "string", "int64_list": "int64", "float_list": "float32"}
_DTYPES = {"string": tf.string, "int64": tf.int64, "float32": tf.float32}


def slice_name(key: SliceKey) -> str:
    """`Overall`, `island=Biscoe`, `island=Biscoe,sex=male`, `body_mass_g=[3000,4000)`."""
    return ",".join(f"{column}={value}" for column, value in key) if key else OVERALL


def spec_matches(spec, key: SliceKey) -> bool:
    """Whether a slice is one of a spec's (TFMA's SingleSliceSpec.is_slice_applicable)."""
    values = dict(key)
    return set(values) == spec.columns() and all(values[k] == v for k, v in spec.feature_values.items())


def bucket_text(bounds: list[float], index: int) -> str:
    """The interval of bucket `index` (np.searchsorted side=right over `bounds`)."""
    low = "-inf" if index == 0 else f"{bounds[index - 1]:g}"
    high = "inf" if index == len(bounds) else f"{bounds[index]:g}"
    return f"({low},{high})" if index == 0 else f"[{low},{high})"


def value_text(value, kind: str) -> str:
    if kind == "string":
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return str(int(value)) if kind == "int64" else format(float(value), ".9g")


def feature_kinds(file_pattern: str, columns: set[str], look_at: int = 1000) -> dict[str, str]:
    """How each slicing column is stored, from the first examples that hold it; a column none of
    them holds is refused (a misspelt feature would otherwise slice nothing, silently)."""
    from trainer.inputs import record_dataset

    kinds: dict[str, str] = {}
    for record in record_dataset(file_pattern).take(look_at):
        features = tf.train.Example.FromString(record.numpy()).features.feature
        for column in columns - set(kinds):
            if column in features and features[column].WhichOneof("kind"):
                kinds[column] = _KINDS[features[column].WhichOneof("kind")]
        if len(kinds) == len(columns):
            return kinds
    raise ValueError(f"evaluator.slicing_specs: feature(s) {sorted(columns - set(kinds))} in none of the first "
                     f"{look_at} examples of {file_pattern}")


@dataclass
class BatchSlices:
    """A batch's slices: `keys[s]` for segment s, and the (row, segment) memberships."""

    keys: list[SliceKey]
    rows: np.ndarray  # int32
    segments: np.ndarray  # int32, dense 0..len(keys)-1

    def tensors(self) -> dict[str, tf.Tensor]:
        return {"rows": tf.constant(self.rows), "segments": tf.constant(self.segments)}


SLICING_COLUMN = "slicing:{}"  # a slicing column's first values beside the labels ("...:present": whether held)


def parse_with_slicing_columns(serialized: tf.Tensor, labels: dict[str, str], columns: dict[str, str]) -> dict[str, tf.Tensor]:
    """parse_examples' labels and, in the same parse, each slicing column's first value per row
    (SLICING_COLUMN) and whether the row holds one (NaN does not)."""
    from trainer.features import checked_columns, value_dtype

    spec = {name: tf.io.RaggedFeature(value_dtype(kind)) for name, kind in labels.items()}
    spec.update({c: tf.io.RaggedFeature(_DTYPES[k]) for c, k in columns.items() if c not in spec})
    parsed = tf.io.parse_example(serialized, spec)
    out = checked_columns({name: parsed[name] for name in labels}, labels)
    for column, kind in columns.items():
        values = parsed[column]
        if values.dtype != _DTYPES[kind]:  # a label column parsed as the label's kind
            values = tf.cast(values, _DTYPES[kind])
        default = "" if kind == "string" else 0
        first = values[:, :1].to_tensor(default_value=default, shape=[None, 1])[:, 0]
        present = values.row_lengths() > 0
        if kind == "float32":
            present &= ~tf.math.is_nan(first)
        name = SLICING_COLUMN.format(column)
        out[name + ":present"] = present
        if kind == "string":  # hashed here: sorting Python bytes on the host cost more than the rest of the slicing
            out[name], out[name + ":codes"] = tf.unique(first, out_idx=tf.int32)
        else:
            out[name] = first
    return out


def _parsed_column(parsed: dict[str, np.ndarray], name: str) -> tuple:
    """(values or codes per row, held, the codes' values or None) from parse_with_slicing_columns."""
    if name + ":codes" in parsed:
        return parsed[name + ":codes"], parsed[name + ":present"], parsed[name]
    return parsed[name], parsed[name + ":present"], None


class Slicer:
    """Each row's slices for a list of SlicingSpecs (the overall slice always first). A row missing a
    spec's feature (or holding NaN) is in none of that spec's slices (as in TFMA); of a feature with
    several values, the first is read."""

    def __init__(self, specs: list, kinds: dict[str, str]):
        self.specs = list(specs)
        self.kinds = kinds
        self._parse_spec = {c: tf.io.VarLenFeature(_DTYPES[k]) for c, k in kinds.items()}

    @classmethod
    def for_split(cls, specs: list, file_pattern: str) -> "Slicer":
        columns = set().union(*(s.columns() for s in specs)) if specs else set()
        return cls(specs, feature_kinds(file_pattern, columns) if columns else {})

    def batch(self, serialized: np.ndarray, parsed: dict[str, np.ndarray] | None = None) -> BatchSlices:
        """`parsed`: the batch's parse_with_slicing_columns answer, when the reader parsed them;
        else they are parsed here."""
        rows = len(serialized)
        keys: list[SliceKey] = [()]
        members, segments = [np.arange(rows, dtype=np.int32)], [np.zeros(rows, np.int32)]
        if self.kinds and parsed is not None and SLICING_COLUMN.format(next(iter(self.kinds))) in parsed:
            columns = {c: _parsed_column(parsed, SLICING_COLUMN.format(c)) for c in self.kinds}
        else:
            columns = self._columns(serialized, rows) if self.kinds else {}
        for spec in self.specs:
            spec_rows, codes, spec_keys = self._spec_slices(spec, columns, rows)
            members.append(spec_rows)
            segments.append(codes + len(keys))
            keys.extend(spec_keys)
        return BatchSlices(keys, np.concatenate(members).astype(np.int32), np.concatenate(segments).astype(np.int32))

    def _columns(self, serialized: np.ndarray, rows: int) -> dict[str, tuple]:
        """Each column's first value per row, whether the row has one, and None (no lookup)."""
        parsed = tf.io.parse_example(tf.constant(serialized, tf.string), self._parse_spec)
        out = {}
        for column, sparse in parsed.items():
            indices, values = sparse.indices.numpy(), sparse.values.numpy()
            first = indices[:, 1] == 0
            present = np.zeros(rows, bool)
            present[indices[first, 0]] = True
            column_values = np.zeros(rows, values.dtype) if values.dtype != object else np.full(rows, b"", object)
            column_values[indices[first, 0]] = values[first]
            if column_values.dtype.kind == "f":  # NaN is a missing number (CSV's empty cell read as float)
                present &= ~np.isnan(column_values)
            out[column] = (column_values, present, None)
        return out

    def _spec_slices(self, spec, columns, rows: int) -> tuple[np.ndarray, np.ndarray, list[SliceKey]]:
        """The rows in the spec's slices, each one's slice (0..n-1) and the n slice keys."""
        names = sorted(spec.columns())
        keep = np.ones(rows, bool)
        for name in names:
            keep &= columns[name][1]
        code = np.zeros(int(keep.sum()), np.int64)
        texts: list[list[str]] = []
        for name in names:
            values, lookup = columns[name][0][keep], columns[name][2]
            if name in spec.feature_buckets:
                values = np.searchsorted(np.asarray(spec.feature_buckets[name]), values, side="right")
            unique, inverse = np.unique(values, return_inverse=True)
            text = [bucket_text(spec.feature_buckets[name], int(u)) if name in spec.feature_buckets
                    else value_text(u if lookup is None else lookup[u], self.kinds[name]) for u in unique]
            if name in spec.feature_values:  # only the rows holding the wanted value
                wanted = np.array([t == spec.feature_values[name] for t in text], bool)
                selected = wanted[inverse]
                keep[np.flatnonzero(keep)[~selected]] = False
                code, inverse = code[selected], inverse[selected]
            code = code * len(unique) + inverse
            texts.append(text)
        slices, segment = np.unique(code, return_inverse=True)
        keys = []
        for value in slices:
            parts = []
            for name, text in reversed(list(zip(names, texts))):
                value, index = divmod(int(value), len(text))
                parts.append((name, text[index]))
            keys.append(tuple(reversed(parts)))
        return np.flatnonzero(keep).astype(np.int32), segment.astype(np.int32), keys


@tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
def slice_row_values(heads: list[Head], targets: dict[str, tf.Tensor], outputs: dict[str, tf.Tensor],
                     losses) -> dict[str, tf.Tensor]:
    """What is summed per slice, row by row, beside HeadTotals.row_values: the row itself, each
    regression's absolute, percentage and logarithmic errors and each classifier's (label, predicted
    class) cell, the label and prediction of a regression or a binary head (class 1's) for
    TFMA's means, and a multi-class head's (row, class) pairs' probability and cross-entropy sums
    for its micro averages."""
    values = {}
    values["examples"] = tf.ones_like(losses[heads[0].name][1]) if heads else tf.zeros([0])
    for head in heads:
        mask = losses[head.name][1]
        if head.kind == CLASSIFICATION and 0 < len(head.vocabulary or []) <= MAX_CONFUSION_CLASSES:
            k = len(head.vocabulary)
            predicted = tf.argmax(outputs[head.name], axis=-1, output_type=tf.int32)
            cell = tf.maximum(targets[head.name], 0) * k + predicted
            values[f"{head.name}/confusion"] = tf.one_hot(cell, k * k) * mask[:, tf.newaxis]
            if k == 2:
                values[f"{head.name}/label"] = tf.cast(targets[head.name] == 1, tf.float32) * mask
                values[f"{head.name}/prediction"] = outputs[head.name][:, 1] * mask
            else:  # the (row, class) pairs' sums for micro averages (micro_figures)
                onehot = tf.one_hot(tf.maximum(targets[head.name], 0), k)
                values[f"{head.name}/pair_prediction"] = tf.reduce_sum(outputs[head.name], axis=-1) * mask
                values[f"{head.name}/pair_crossentropy"] = tf.reduce_sum(
                    keras_binary_crossentropy(onehot, outputs[head.name]), axis=-1) * mask
        elif head.kind != CLASSIFICATION:
            label = tf.where(mask > 0, targets[head.name], 0.0)
            prediction = tf.reshape(outputs[head.name], [-1]) * mask
            values[f"{head.name}/abs_error"] = tf.abs(prediction - label) * mask
            values[f"{head.name}/label"], values[f"{head.name}/prediction"] = label, prediction
            values.update(_error_rows(head.name, label, prediction, mask))
    return values


KERAS_EPSILON = 1e-7


def keras_binary_crossentropy(labels: tf.Tensor, probabilities: tf.Tensor) -> tf.Tensor:
    """Each pair's binary cross-entropy as Keras' BinaryCrossentropy (TFMA's, micro-averaged)
    computes it: the probability clipped to [eps, 1 - eps], then eps added inside the logarithms."""
    p = tf.clip_by_value(probabilities, KERAS_EPSILON, 1.0 - KERAS_EPSILON)
    return -(labels * tf.math.log(p + KERAS_EPSILON) + (1.0 - labels) * tf.math.log(1.0 - p + KERAS_EPSILON))


def _error_rows(head: str, label: tf.Tensor, prediction: tf.Tensor, mask: tf.Tensor) -> dict[str, tf.Tensor]:
    """A regression's absolute percentage and squared logarithmic errors, each with the rows it is
    defined on (TFMA leaves out a row labelled 0, and one whose logarithm is not a number)."""
    percentage = 100.0 * tf.abs((label - prediction) / label)
    logarithmic = tf.square(tf.math.log(label + 1.0) - tf.math.log(prediction + 1.0))
    out = {}
    for name, error, rows in (("ape", percentage, label != 0), ("sle", logarithmic, True)):
        kept = tf.logical_and(tf.logical_and(mask > 0, rows), tf.logical_not(tf.math.is_nan(error)))
        out[f"{head}/{name}"], out[f"{head}/{name}_rows"] = tf.where(kept, error, 0.0), tf.cast(kept, tf.float32)
    return out


@tf.autograph.experimental.do_not_convert
def auc_histograms(heads: list[Head], targets: dict[str, tf.Tensor], outputs: dict[str, tf.Tensor], losses,
                   index: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Per classifier and slice, `[slices, classes, AUC_BUCKETS + 1, 2]`: labelled rows (negative,
    positive for the class) by the bucket ceil(p x AUC_BUCKETS) of the class's probability p, so
    that p > i / AUC_BUCKETS exactly when the bucket is above i (computed in float64, as TFMA
    compares a float32 probability with its thresholds)."""
    sums = {}
    count = tf.reduce_max(index["segments"]) + 1
    for head in heads:
        k = len(head.vocabulary or [])
        if head.kind != CLASSIFICATION or not 0 < k <= MAX_CONFUSION_CLASSES:
            continue
        scores = tf.gather(tf.cast(outputs[head.name], tf.float64), index["rows"])
        bucket = tf.clip_by_value(tf.cast(tf.math.ceil(scores * AUC_BUCKETS), tf.int32), 0, AUC_BUCKETS)
        positive = tf.one_hot(tf.gather(tf.maximum(targets[head.name], 0), index["rows"]), k, dtype=tf.int32)
        mask = tf.gather(losses[head.name][1], index["rows"])
        cell = ((index["segments"][:, None] * k + tf.range(k)[None, :]) * (AUC_BUCKETS + 1) + bucket) * 2 + positive
        flat = tf.math.unsorted_segment_sum(tf.reshape(tf.tile(mask[:, None], [1, k]), [-1]), tf.reshape(cell, [-1]),
                                            count * k * (AUC_BUCKETS + 1) * 2)
        sums[f"{head.name}/auc_histogram"] = tf.reshape(flat, [count, k, AUC_BUCKETS + 1, 2])
    return sums


# TFMA's CalibrationPlot buckets at its default 1,000 over [0, 1] (n = AUC_BUCKETS): (-inf, 0),
# [0, 1 / n), ..., [(n - 1) / n, 1), [1, inf), every one written, empty or not.
CALIBRATION_PLOT_BUCKETS = AUC_BUCKETS + 2


@tf.autograph.experimental.do_not_convert
def calibration_plot_sums(heads: list[Head], targets: dict[str, tf.Tensor], outputs: dict[str, tf.Tensor], losses,
                          index: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Per classifier and slice, `[slices, CALIBRATION_PLOT_BUCKETS, 3]`: labelled rows, their labels
    and probabilities by TFMA's CalibrationPlot bucket floor(p x n) + 1 (in float64, as TFMA buckets
    a prediction): a binary head's class 1, a multi-class head's (row, class) pairs (micro-averaged)."""
    sums = {}
    count = tf.reduce_max(index["segments"]) + 1
    for head in heads:
        k = len(head.vocabulary or [])
        if head.kind != CLASSIFICATION or not 2 <= k <= MAX_CONFUSION_CLASSES:
            continue
        scores = tf.gather(tf.cast(outputs[head.name], tf.float64), index["rows"])
        labels = tf.one_hot(tf.gather(tf.maximum(targets[head.name], 0), index["rows"]), k, dtype=tf.float64)
        mask = tf.gather(tf.cast(losses[head.name][1], tf.float64), index["rows"])[:, None]
        segments = index["segments"][:, None] + tf.zeros([1, k], tf.int32)
        if k == 2:  # class 1
            scores, labels, segments = scores[:, 1:], labels[:, 1:], segments[:, 1:]
        probability = tf.reshape(scores, [-1])
        bucket = tf.clip_by_value(tf.cast(tf.floor(probability * AUC_BUCKETS), tf.int32) + 1, 0, AUC_BUCKETS + 1)
        weight = tf.reshape(mask + tf.zeros_like(scores), [-1])
        values = tf.stack([weight, tf.reshape(labels, [-1]) * weight, probability * weight], axis=1)
        flat = tf.math.unsorted_segment_sum(values, tf.reshape(segments, [-1]) * CALIBRATION_PLOT_BUCKETS + bucket,
                                            count * CALIBRATION_PLOT_BUCKETS)
        sums[f"{head.name}/calibration_plot"] = tf.reshape(flat, [count, CALIBRATION_PLOT_BUCKETS, 3])
    return sums


def threshold_counts(negatives: np.ndarray, positives: np.ndarray) -> tuple[np.ndarray, ...]:
    """(tp, fp, fn, tn) at the thresholds Keras' and TFMA's AUC use, from auc_histograms' buckets:
    -eps, 1 / n .. (n - 1) / n, 1 + eps (n = AUC_BUCKETS), a row counted positive above each."""
    return _counts_above(negatives, positives, first=2)


# TFMA's ConfusionMatrixPlot thresholds: -1e-6, then 0, 1 / n, ..., 1 (n = AUC_BUCKETS, TFMA's
# default 1,000), a row counted positive above each.
PLOT_THRESHOLDS = np.concatenate([[-1e-6], np.arange(AUC_BUCKETS + 1) / AUC_BUCKETS])


def plot_counts(negatives: np.ndarray, positives: np.ndarray) -> tuple[np.ndarray, ...]:
    """(tp, fp, fn, tn) at PLOT_THRESHOLDS, from auc_histograms' buckets (above i / n: the buckets
    above i)."""
    return _counts_above(negatives, positives, first=1)


def _counts_above(negatives: np.ndarray, positives: np.ndarray, first: int) -> tuple[np.ndarray, ...]:
    """(tp, fp, fn, tn): every row above the first threshold, the rows in bucket j or above at the
    middle ones (j from `first` to AUC_BUCKETS), none above the last."""

    def above(counts: np.ndarray) -> np.ndarray:
        at_or_above = np.cumsum(counts[::-1])[::-1]  # rows in bucket >= j
        return np.concatenate([[counts.sum()], at_or_above[first:AUC_BUCKETS + 1], [0.0]])

    tp, fp = above(positives), above(negatives)
    return tp, fp, positives.sum() - tp, negatives.sum() - fp


def roc_auc(negatives: np.ndarray, positives: np.ndarray) -> float | None:
    """The ROC curve's area from auc_histograms' buckets, as Keras' and TFMA's AUC compute it
    (threshold_counts; trapezoids); None without both classes."""
    if positives.sum() == 0 or negatives.sum() == 0:
        return None
    tp, fp, _, _ = threshold_counts(negatives, positives)
    tpr, fpr = tp / positives.sum(), fp / negatives.sum()
    return float(np.sum((fpr[:-1] - fpr[1:]) * (tpr[:-1] + tpr[1:]) / 2))


def pr_auc(negatives: np.ndarray, positives: np.ndarray) -> float | None:
    """The precision-recall curve's area at threshold_counts, by TFMA's AUCPrecisionRecall
    interpolation (Davis and Goadrich: precision interpolated along the predicted positives); None
    without a positive row (TFMA's sum of NaNs)."""
    if positives.sum() == 0:
        return None
    tp, fp, fn, _ = threshold_counts(negatives, positives)
    with np.errstate(divide="ignore", invalid="ignore"):
        dtp, p = tp[:-1] - tp[1:], tp + fp
        slope = dtp / np.maximum(p[:-1] - p[1:], 0)
        intercept = tp[1:] - slope * p[1:]
        ratio = np.divide(p[:-1], p[1:], out=np.ones_like(p[1:]), where=p[1:] != 0)
        return float(np.nansum(slope * (dtp + intercept * np.log(ratio)) / np.maximum(tp[1:] + fn[1:], 0)))


def operating_point(negatives: np.ndarray, positives: np.ndarray, point: OperatingPoint) -> float | None:
    """TFMA's PrecisionAtRecall family at threshold_counts: the largest `point.best` rate among the
    thresholds whose `point.given` rate is at least `point.at` (TFMA's _find_max_under_constraint:
    0 where no threshold reaches it; None where every such rate is undefined, TFMA's NaN)."""
    tp, fp, fn, tn = threshold_counts(negatives, positives)
    with np.errstate(divide="ignore", invalid="ignore"):
        rates = {"precision": tp / (tp + fp), "recall": tp / (tp + fn), "specificity": tn / (tn + fp)}
    best = rates[point.best][rates[point.given] >= point.at]
    if best.size == 0:
        return 0.0
    return None if np.isnan(best).all() else float(np.nanmax(best))


def _points(figures) -> list[OperatingPoint]:
    return [figure for figure in figures if isinstance(figure, OperatingPoint)]


def segment_sums(values: dict[str, tf.Tensor], index: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Each value summed per slice (`[slices, ...]`) over BatchSlices.tensors()' memberships."""
    count = tf.reduce_max(index["segments"]) + 1
    return {name: tf.math.unsorted_segment_sum(tf.gather(value, index["rows"]), index["segments"], count)
            for name, value in values.items()}


@tf.autograph.experimental.do_not_convert
def calibration_sums(heads: list[Head], targets: dict[str, tf.Tensor], outputs: dict[str, tf.Tensor],
                     losses) -> dict[str, tf.Tensor]:
    """Per classifier, `[CALIBRATION_BINS, 3]` (rows, sum of the predicted probability, sum of the
    outcome) by the probability's bin: the top class's confidence and whether it is right, or for a
    binary head class 1's probability and whether the label is class 1."""
    sums = {}
    for head in heads:
        if head.kind != CLASSIFICATION or not head.vocabulary:
            continue
        mask, target, scores = losses[head.name][1], targets[head.name], outputs[head.name]
        if len(head.vocabulary) == 2:
            probability, outcome = scores[:, 1], tf.cast(target == 1, tf.float32)
        else:
            probability = tf.reduce_max(scores, axis=-1)
            outcome = tf.cast(tf.argmax(scores, axis=-1, output_type=tf.int32) == target, tf.float32)
        bins = tf.clip_by_value(tf.cast(tf.floor(probability * CALIBRATION_BINS), tf.int32), 0, CALIBRATION_BINS - 1)
        columns = tf.stack([mask, probability * mask, outcome * mask], axis=1)
        sums[f"{head.name}/calibration"] = tf.math.unsorted_segment_sum(columns, bins, CALIBRATION_BINS)
    return sums


def head_auc(histogram: np.ndarray) -> float | None:
    """A binary head's AUC of class 1; a multi-class head's mean one-vs-rest AUC over the classes
    that have both positive and negative rows in the slice."""
    if len(histogram) == 2:
        return roc_auc(histogram[1, :, 0], histogram[1, :, 1])
    areas = [a for a in (roc_auc(h[:, 0], h[:, 1]) for h in histogram) if a is not None]
    return float(np.mean(areas)) if areas else None


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def _balanced_accuracy(tp, fp, fn, tn):
    return (tp / (tp + fn) + tn / (tn + fp)) / 2 if tp + fn > 0 and tn + fp > 0 else None


# TFMA's confusion-matrix metrics (trainer.evaluator_config.CONFUSION_METRICS) from the counts at
# threshold 0.5, as TFMA's `result(tp, tn, fp, fn)` computes them; None where TFMA's is NaN (a zero
# denominator), which fails every threshold: a missing figure refuses the candidate as well.
CONFUSION_FIGURES = {
    "precision": lambda tp, fp, fn, tn: _ratio(tp, tp + fp),
    "recall": lambda tp, fp, fn, tn: _ratio(tp, tp + fn),
    "f1_score": lambda tp, fp, fn, tn: _ratio(2 * tp, 2 * tp + fp + fn),
    "specificity": lambda tp, fp, fn, tn: _ratio(tn, tn + fp),
    "fall_out": lambda tp, fp, fn, tn: _ratio(fp, fp + tn),
    "miss_rate": lambda tp, fp, fn, tn: _ratio(fn, fn + tp),
    "negative_predictive_value": lambda tp, fp, fn, tn: _ratio(tn, tn + fn),
    "false_discovery_rate": lambda tp, fp, fn, tn: _ratio(fp, fp + tp),
    "false_omission_rate": lambda tp, fp, fn, tn: _ratio(fn, fn + tn),
    "prevalence": lambda tp, fp, fn, tn: _ratio(tp + fn, tp + fp + fn + tn),
    "threat_score": lambda tp, fp, fn, tn: _ratio(tp, tp + fn + fp),
    "balanced_accuracy": _balanced_accuracy,
    "matthews_correlation_coefficient": lambda tp, fp, fn, tn: _ratio(
        tp * tn - fp * fn, math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))),
    "true_positives": lambda tp, fp, fn, tn: tp,
    "false_positives": lambda tp, fp, fn, tn: fp,
    "true_negatives": lambda tp, fp, fn, tn: tn,
    "false_negatives": lambda tp, fp, fn, tn: fn,
}


def confusion_figures(tp: float, fp: float, fn: float, tn: float, names) -> dict[str, float]:
    """The named CONFUSION_FIGURES of these counts, leaving out those undefined here."""
    figures = {name: CONFUSION_FIGURES[name](tp, fp, fn, tn) for name in names}
    return {name: float(value) for name, value in figures.items() if value is not None}


def mean_figures(head: str, sums: dict[str, np.ndarray], names) -> dict[str, float]:
    """TFMA's MeanLabel, MeanPrediction and Calibration (predictions over labels, left out where the
    labels sum to 0: TFMA's NaN) of the `names` wanted, for a head with label and prediction sums."""
    if f"{head}/label" not in sums:
        return {}
    count, label, prediction = (float(sums[f"{head}/{k}"]) for k in ("count", "label", "prediction"))
    figures = {"mean_label": _ratio(label, count), "mean_prediction": _ratio(prediction, count),
               "calibration": prediction / label if abs(label) > 1e-8 else None}  # TFMA: NaN where isclose(0)
    return {f"{head}_{name}": value for name, value in figures.items() if name in names and value is not None}


def error_figures(head: str, sums: dict[str, np.ndarray], names) -> dict[str, float]:
    """A regression's mean absolute percentage error and mean squared logarithmic error, of the
    `names` wanted, over the rows each is defined on (none without such a row: TFMA's NaN)."""
    figures = {figure: _ratio(float(sums[f"{head}/{row}"]), float(sums[f"{head}/{row}_rows"]))
               for figure, row in (("mape", "ape"), ("msle", "sle")) if f"{head}/{row}" in sums}
    return {f"{head}_{name}": value for name, value in figures.items() if name in names and value is not None}


def classifier_figures(head: str, sums: dict[str, np.ndarray], figures=ALWAYS_CONFUSION_FIGURES) -> dict[str, float]:
    """A classifier's AUC from its histograms and, for a binary head, the confusion `figures` of
    class 1 at its predicted class (p > 0.5, TFMA's default threshold) and its precision-recall AUC
    where `figures` has it."""
    confusion = [name for name in figures if name in CONFUSION_FIGURES]
    out = {}
    histogram = sums.get(f"{head}/auc_histogram")
    if histogram is not None:
        auc = head_auc(histogram)
        if auc is not None:
            out[f"{head}_auc"] = auc
        binary = len(histogram) == 2
        area = pr_auc(histogram[1, :, 0], histogram[1, :, 1]) if PR_AUC in figures and binary else None
        if area is not None:
            out[f"{head}_{PR_AUC}"] = area
        for point in _points(figures) if binary else []:
            value = operating_point(histogram[1, :, 0], histogram[1, :, 1], point)
            if value is not None:
                out[f"{head}_{point.name}"] = value
    cells = sums.get(f"{head}/confusion")
    if cells is not None and np.size(cells) == 4:
        tn, fp, fn, tp = np.asarray(cells, np.float64).tolist()
        out.update({f"{head}_{name}": value for name, value in confusion_figures(tp, fp, fn, tn, confusion).items()})
    return out


def class_figures(head: str, histogram: np.ndarray, class_ids: list[int],
                  figures=ALWAYS_CONFUSION_FIGURES) -> dict[str, float]:
    """Each class's figures one against the rest, as TFMA's binarize computes them: the class's
    probability above 0.5 is a positive, the label being the class a positive label. A class id
    the head does not have, or without a labelled row, has none."""
    out, confusion = {}, [name for name in figures if name in CONFUSION_FIGURES]
    for c in class_ids:
        if c >= len(histogram):
            continue
        negatives, positives = histogram[c, :, 0], histogram[c, :, 1]
        # The counts at threshold index AUC_BUCKETS / 2: a positive is p > 0.5.
        tp, fp, fn, tn = (float(counts[AUC_BUCKETS // 2]) for counts in threshold_counts(negatives, positives))
        if tp + fp + fn + tn == 0:
            continue
        values = {"accuracy": (tp + tn) / (tp + fp + fn + tn), "auc": roc_auc(negatives, positives),
                  **confusion_figures(tp, fp, fn, tn, confusion)}
        if PR_AUC in figures:
            values[PR_AUC] = pr_auc(negatives, positives)
        values.update({point.name: operating_point(negatives, positives, point) for point in _points(figures)})
        out.update({class_figure(f"{head}_{name}", c): float(v) for name, v in values.items() if v is not None})
    return out


def pair_histogram(histogram: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A multi-class head's (negatives, positives) per bucket over every (row, class) pair: its
    per-class histograms ([classes, buckets, 2]) summed over the classes."""
    return histogram[:, :, 0].sum(axis=0), histogram[:, :, 1].sum(axis=0)


def micro_figures(head: str, sums: dict[str, np.ndarray], figures=ALWAYS_CONFUSION_FIGURES) -> dict[str, float]:
    """A multi-class head's figures over every (row, class) pair, TFMA's micro_average: each class's
    probability against whether the row is of the class, from the per-class histograms summed over
    the classes (at TFMA's threshold 0.5), and the pairs' probability and cross-entropy sums."""
    histogram = sums.get(f"{head}/auc_histogram")
    if histogram is None or len(histogram) < 3:
        return {}
    negatives, positives = pair_histogram(histogram)
    pairs, labels = float(negatives.sum() + positives.sum()), float(positives.sum())
    tp, fp, fn, tn = (float(counts[AUC_BUCKETS // 2]) for counts in threshold_counts(negatives, positives))
    prediction = float(sums[f"{head}/pair_prediction"])
    values = {"accuracy": (tp + tn) / pairs, "auc": roc_auc(negatives, positives),
              "loss": float(sums[f"{head}/pair_crossentropy"]) / pairs, "mean_label": labels / pairs,
              "mean_prediction": prediction / pairs, "calibration": prediction / labels if labels > 0 else None,
              **confusion_figures(tp, fp, fn, tn, [name for name in figures if name in CONFUSION_FIGURES])}
    if PR_AUC in figures:
        values[PR_AUC] = pr_auc(negatives, positives)
    values.update({point.name: operating_point(negatives, positives, point) for point in _points(figures)})
    return {micro_figure(f"{head}_{name}"): float(v) for name, v in values.items() if v is not None}


class SliceTotals:
    """One model's per-slice sums over the batches, by slice key, and the overall calibration bins."""

    def __init__(self, heads: list[Head]):
        self.heads = heads
        self.sums: dict[SliceKey, dict[str, np.ndarray]] = {}
        self.calibration: dict[str, np.ndarray] = {}

    def add(self, keys: list[SliceKey], sums: dict[str, tf.Tensor], calibration: dict[str, tf.Tensor]) -> None:
        arrays = {name: np.asarray(value, np.float64) for name, value in sums.items()}
        for i, key in enumerate(keys):
            totals = self.sums.setdefault(key, {})
            for name, array in arrays.items():
                totals[name] = totals.get(name, 0.0) + array[i]
        for name, value in calibration.items():
            self.calibration[name] = self.calibration.get(name, 0.0) + np.asarray(value, np.float64)

    def metrics(self, key: SliceKey, class_ids: dict[str, list[int]] | None = None,
                figures=ALWAYS_CONFUSION_FIGURES, micro: set[str] = frozenset()) -> dict[str, float]:
        """HeadTotals' metrics of the slice, with `<head>_mae` and `_mse` for regressions, `_auc` for
        classifiers, and of the optional `figures` (EvaluatorConfig.slice_figures) the confusion ones
        (CONFUSION_FIGURES) for binary heads, the means for those and regressions, a regression's
        percentage and logarithmic errors, and `class_ids`' figures one class against the rest
        (`{head: ids}`: class_figures), and the `micro` heads' figures micro-averaged (micro_figures);
        a head without a labelled row in the slice has no figures there (nor has the total `loss`)."""
        sums = self.sums[key]
        totals = HeadTotals(self.heads)
        totals.add_sums({k: v for k, v in sums.items() if np.ndim(v) == 0 and "/" in k})
        metrics = totals.metrics()
        for head in self.heads:
            if sums.get(f"{head.name}/count", 0.0) == 0:
                metrics = {k: v for k, v in metrics.items() if not k.startswith(f"{head.name}_") or k.endswith("_examples")}
                metrics.pop("loss", None), metrics.pop("weighted_loss", None)
                continue
            metrics.update(mean_figures(head.name, sums, figures))
            if f"{head.name}/abs_error" in sums:
                metrics[f"{head.name}_mae"] = float(sums[f"{head.name}/abs_error"]) / float(sums[f"{head.name}/count"])
                metrics[f"{head.name}_mse"] = metrics[f"{head.name}_rmse"] ** 2
                metrics.update(error_figures(head.name, sums, figures))
            else:
                metrics.update(classifier_figures(head.name, sums, figures))
                if (class_ids or {}).get(head.name) and f"{head.name}/auc_histogram" in sums:
                    metrics.update(class_figures(head.name, sums[f"{head.name}/auc_histogram"], class_ids[head.name],
                                                 figures))
                if head.name in micro:
                    metrics.update(micro_figures(head.name, sums, figures))
        return metrics

    def examples(self, key: SliceKey) -> int:
        return int(round(float(self.sums[key].get("examples", 0.0))))

    def confusion(self, key: SliceKey) -> dict[str, dict]:
        out = {}
        for head in self.heads:
            cells = self.sums[key].get(f"{head.name}/confusion")
            if cells is not None:
                k = len(head.vocabulary)
                out[head.name] = {"classes": list(head.vocabulary),
                                  "matrix": np.rint(np.reshape(cells, (k, k))).astype(int).tolist()}
        return out

    def plot_counts(self, key: SliceKey, micro: set[str] = frozenset()) -> dict[str, tuple[np.ndarray, ...]]:
        """Each binary head's class 1 (tp, fp, fn, tn) at PLOT_THRESHOLDS in the slice (TFMA's
        ConfusionMatrixPlot), and the `micro` heads' of their (row, class) pairs."""
        out = {}
        for head in self.heads:
            histogram = self.sums[key].get(f"{head.name}/auc_histogram")
            if histogram is not None and len(histogram) == 2:
                out[head.name] = plot_counts(histogram[1, :, 0], histogram[1, :, 1])
            elif histogram is not None and head.name in micro:
                out[head.name] = plot_counts(*pair_histogram(histogram))
        return out

    def calibration_plot(self, key: SliceKey) -> dict[str, np.ndarray]:
        """The calibration_plot_sums in the slice of the heads they were summed for."""
        sums = self.sums[key]
        return {head.name: sums[f"{head.name}/calibration_plot"] for head in self.heads
                if f"{head.name}/calibration_plot" in sums}

    def calibration_bins(self) -> dict[str, list[dict]]:
        out = {}
        for head in self.heads:
            bins = self.calibration.get(f"{head.name}/calibration")
            if bins is None:
                continue
            # Empty bins are left out: every bin listed has a mean prediction and an observed rate.
            out[head.name] = [{"lower": i / CALIBRATION_BINS, "upper": (i + 1) / CALIBRATION_BINS,
                               "examples": int(round(n)), "mean_prediction": p / n, "observed": o / n}
                              for i, (n, p, o) in enumerate(bins.tolist()) if n > 0]
        return out
