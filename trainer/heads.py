"""Model heads: what each output predicts, how its label is encoded and how its loss is taken."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import keras
import tensorflow as tf

CLASSIFICATION = "classification"
REGRESSION = "regression"


@dataclass
class Head:
    """One output of the model, named after the label column it predicts.

    Classification labels are strings encoded as indices into `vocabulary` (-1 when missing or
    unseen); regression labels are float32 (NaN when missing). Examples without a label are
    masked out of that head's loss, so a row missing one label still trains the other heads.
    """

    name: str
    kind: str
    vocabulary: list[str] | None = None
    mean: float = 0.0
    std: float = 1.0
    weight: float = 1.0
    label_dtype: str = "string"  # how the label is stored in the tf.Examples: string, int64 or float32

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

    def encode_label(self, values: tf.Tensor) -> tf.Tensor:
        """Raw label column (`[batch, 1]`) to training targets (`[batch]`)."""
        if self.kind == CLASSIFICATION:
            values = tf.reshape(values, [-1])
            matches = tf.equal(values[:, tf.newaxis], tf.constant(self.vocabulary)[tf.newaxis, :])
            found = tf.reduce_any(matches, axis=1)
            return tf.where(found, tf.argmax(tf.cast(matches, tf.int32), axis=1, output_type=tf.int32), -1)
        return tf.reshape(tf.cast(values, tf.float32), [-1])

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
