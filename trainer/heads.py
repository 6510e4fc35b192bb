"""Model heads: what each output predicts, how its label is encoded, how its loss is taken and
how it is evaluated."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import cached_property

import keras
import numpy as np
import tensorflow as tf

CLASSIFICATION = "classification"
REGRESSION = "regression"
MISSING_LABEL = -1
UNSEEN_LABEL = -2
FINGERPRINTS = 2**63 - 1  # tf.strings.to_hash_bucket_fast's widest range: a string's 64-bit fingerprint


@dataclass
class Head:
    """One output of the model, named after the label column it predicts.

    Classification labels are strings (or whole numbers, written as text: 3 -> "3") encoded as
    indices into `vocabulary` (MISSING_LABEL when missing, UNSEEN_LABEL for a class the training
    split did not hold, counted as `<head>_unseen_label_examples`); regression labels are float32 (NaN when missing). Examples without a label are
    masked out of that head's loss, so a row missing one label still trains the other heads.
    """

    name: str
    kind: str
    vocabulary: list[str] | None = None
    mean: float = 0.0
    std: float = 1.0
    weight: float = 1.0
    label_dtype: str = "string"  # how the label is stored in the tf.Examples: string, int64 or float32
    column: str | None = None  # the label column, when `name` (its signature_name) differs

    @property
    def label_column(self) -> str:
        return self.column or self.name

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Head":
        return cls(**data)

    def output_layer(self, hidden: tf.Tensor) -> tf.Tensor:
        """The head's output in float32 (also under mixed precision)."""
        if self.kind == CLASSIFICATION:
            return keras.layers.Dense(len(self.vocabulary), activation="softmax", dtype="float32", name=self.name)(hidden)
        raw = keras.layers.Dense(1, dtype="float32", name=f"{self.name}_standardized")(hidden)
        # Predict in the label's units; the loss divides by std again, so it trains on z-scores.
        return keras.layers.Rescaling(self.std, offset=self.mean, dtype="float32", name=self.name)(raw)

    @tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
    def encode_label(self, values: tf.Tensor) -> tf.Tensor:
        """Raw label column (`[batch, 1]`) to training targets (`[batch]`)."""
        if self.kind == CLASSIFICATION:
            values = tf.reshape(values, [-1])
            if values.dtype != tf.string:  # whole numbers as text, NaN (missing) as "", others unseen
                finite = tf.math.is_finite(values)
                whole = tf.where(finite, values, 0.0)
                text = tf.strings.as_string(tf.cast(whole, tf.int64))
                values = tf.where(finite, tf.where(tf.equal(whole, tf.round(whole)), text, "<not a whole number>"), "")
            index, found = self._class_index(values)
            return tf.where(found, index, tf.where(tf.equal(values, ""), MISSING_LABEL, UNSEEN_LABEL))
        return tf.reshape(tf.cast(values, tf.float32), [-1])

    def _class_index(self, values: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Each text's index in the vocabulary (int32) and whether it is there. Its fingerprint is
        looked up among the classes' (sorted), then the text compared with that class's: a few ops
        per row whatever the number of classes, where comparing with every class cost rows x classes
        string compares. Classes that share a fingerprint (or repeat) are compared one by one."""
        if not self.vocabulary:
            return tf.zeros_like(values, tf.int32), tf.zeros_like(values, tf.bool)
        vocabulary = tf.constant(self.vocabulary)
        if self._sorted_fingerprints is None:
            matches = tf.equal(values[:, tf.newaxis], vocabulary[tf.newaxis, :])
            return tf.argmax(tf.cast(matches, tf.int32), axis=1, output_type=tf.int32), tf.reduce_any(matches, axis=1)
        fingerprints, classes = self._sorted_fingerprints
        position = tf.searchsorted(fingerprints, tf.strings.to_hash_bucket_fast(values, FINGERPRINTS))
        index = tf.gather(classes, tf.minimum(position, len(classes) - 1))
        return index, tf.equal(tf.gather(vocabulary, index), values)

    @cached_property
    def _sorted_fingerprints(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The classes' fingerprints in ascending order and the class of each; None when two share one."""
        with tf.init_scope():  # computed once, eagerly, also when first asked inside a traced function
            fingerprints = tf.strings.to_hash_bucket_fast(tf.constant(self.vocabulary), FINGERPRINTS).numpy()
        if len(np.unique(fingerprints)) < len(fingerprints):
            return None
        order = np.argsort(fingerprints)
        return fingerprints[order], order.astype(np.int32)

    @tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
    def per_example_loss(self, target: tf.Tensor, prediction: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Returns (loss per example with masked ones zeroed, mask as float)."""
        if self.kind == CLASSIFICATION:
            mask = target >= 0
            safe = tf.where(mask, target, 0)
            loss = keras.losses.sparse_categorical_crossentropy(safe, prediction)
        else:
            mask = tf.math.is_finite(target)  # NaN: no label; inf: no usable one
            safe = tf.where(mask, target, 0.0)
            loss = tf.square((tf.reshape(prediction, [-1]) - safe) / self.std)
        maskf = tf.cast(mask, tf.float32)
        return loss * maskf, maskf


RowLosses = dict[str, tuple[tf.Tensor, tf.Tensor]]  # head name: (loss per row, mask), Head.per_example_loss


class HeadTotals:
    """Each head's evaluation metrics summed over batches; one definition for the trainer's
    evaluation, the Evaluator and the TFLite parity check: `<head>_loss`, `<head>_accuracy` or
    `<head>_rmse`, `<head>_examples`, the unweighted total `loss`, and `weighted_loss` when the
    heads carry weights (`Head.weight`: the module's loss weights as training ended). Rows without
    a label are left out of that head."""

    def __init__(self, heads: list[Head]):
        self.heads = heads
        self._sums: dict[str, float] = {}

    def _add(self, key: str, value) -> None:
        self._sums[key] = self._sums.get(key, 0.0) + float(value)

    def add(self, targets: dict[str, tf.Tensor], outputs: dict[str, tf.Tensor]) -> RowLosses:
        """`targets`: encoded labels by head name (`Head.encode_label`); `outputs`: the model's, by head name.
        Returns the rows' losses summed here, by head name (`row_losses`), for a caller that also
        needs them row by row."""
        losses = self.row_losses(targets, outputs)
        self.add_sums(self.batch_sums(targets, outputs, losses))
        return losses

    def row_losses(self, targets: dict[str, tf.Tensor], outputs: dict[str, tf.Tensor]) -> RowLosses:
        """Each head's (loss per row, mask), `Head.per_example_loss`."""
        return {head.name: head.per_example_loss(targets[head.name], outputs[head.name]) for head in self.heads}

    def add_sums(self, sums: dict[str, tf.Tensor]) -> None:
        """Adds one batch's `batch_sums` (computed eagerly or returned by a compiled step)."""
        for key, value in sums.items():
            self._add(key, value)

    @tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
    def batch_sums(self, targets: dict[str, tf.Tensor], outputs: dict[str, tf.Tensor],
                   losses: RowLosses | None = None) -> dict[str, tf.Tensor]:
        """One batch's sums; traceable, so an evaluation step can compute them with its predictions.
        `losses`: the batch's `row_losses`, when already computed."""
        return {key: tf.reduce_sum(value) for key, value in self.row_values(targets, outputs, losses).items()}

    @tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
    def row_values(self, targets: dict[str, tf.Tensor], outputs: dict[str, tf.Tensor],
                   losses: RowLosses | None = None) -> dict[str, tf.Tensor]:
        """What batch_sums adds up, row by row (`[rows]` each): summed per slice by trainer.slicing."""
        if losses is None:
            losses = self.row_losses(targets, outputs)
        values = {}
        for head in self.heads:
            target, prediction = targets[head.name], outputs[head.name]
            loss, mask = losses[head.name]
            values[f"{head.name}/loss_sum"] = loss
            values[f"{head.name}/count"] = mask
            if head.kind == CLASSIFICATION:
                values[f"{head.name}/unseen"] = tf.cast(target == UNSEEN_LABEL, tf.float32)
                predicted = tf.argmax(prediction, axis=-1, output_type=tf.int32)
                values[f"{head.name}/correct"] = tf.cast(predicted == target, tf.float32) * mask
            else:
                error = (tf.reshape(prediction, [-1]) - tf.where(mask > 0, target, 0.0)) * mask
                values[f"{head.name}/squared_error"] = tf.square(error)
        return values

    def metrics(self) -> dict[str, float]:
        metrics: dict[str, float] = {}
        total, weighted = 0.0, 0.0
        for head in self.heads:
            examples = self._sums.get(f"{head.name}/count", 0.0)
            count = max(examples, 1.0)
            metrics[f"{head.name}_loss"] = self._sums.get(f"{head.name}/loss_sum", 0.0) / count
            total += metrics[f"{head.name}_loss"]
            weighted += head.weight * metrics[f"{head.name}_loss"]
            if head.kind == CLASSIFICATION:
                metrics[f"{head.name}_accuracy"] = self._sums.get(f"{head.name}/correct", 0.0) / count
                metrics[f"{head.name}_unseen_label_examples"] = self._sums.get(f"{head.name}/unseen", 0.0)
            else:
                metrics[f"{head.name}_rmse"] = math.sqrt(self._sums.get(f"{head.name}/squared_error", 0.0) / count)
            metrics[f"{head.name}_examples"] = examples
        if self.heads:
            metrics["loss"] = total  # unweighted: comparable whatever weights a run ended with
        if any(head.weight != 1.0 for head in self.heads):
            metrics["weighted_loss"] = weighted  # the weights training ended with (recorded at export)
        return metrics
