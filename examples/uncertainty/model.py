"""Penguins with multi-task weights learned from the losses: uncertainty weighting (Kendall, Gal
and Cipolla, 2018). Each head i has a trainable log-variance s_i; the training loss is
sum_i exp(-s_i) * loss_i + s_i. The `+ s_i` term (a model loss) keeps the weights from
collapsing to 0, so each weight settles near 1 / loss_i: the noisier task counts less.

The log-variances are model weights: the optimizer trains them, checkpoints keep them and the
export carries them (unused by serving). `loss_weights(step, losses, model)` reads them.
"""
import keras
import tensorflow as tf

LABELS = {"species": "classification", "body_mass_g": "regression"}


class LogVariances(keras.layers.Layer):
    """Identity on its input; holds one log-variance per head and adds their sum as a loss."""

    def __init__(self, heads, **kwargs):
        super().__init__(**kwargs)
        self.heads = list(heads)

    def build(self, input_shape):
        self.log_variances = self.add_weight(shape=(len(self.heads),), initializer="zeros", name="log_variances")

    def call(self, x):
        self.add_loss(tf.reduce_sum(tf.cast(self.log_variances, tf.float32)))
        return x

    def get_config(self):
        return {**super().get_config(), "heads": self.heads}


def build_model(ctx):
    inputs = ctx.inputs()
    x = LogVariances([h.name for h in ctx.heads], name="log_variances")(ctx.encoder()(inputs))
    x = keras.layers.Dense(64, activation="relu", name="shared_0")(x)
    x = keras.layers.Dense(32, activation="relu", name="shared_1")(x)
    return keras.Model(inputs, {head.name: head.output_layer(x) for head in ctx.heads}, name="penguins_uncertainty")


def loss_weights(step, losses, model):
    """exp(-s_i) per head, from the model's current log-variances."""
    log_variances = tf.cast(model.get_layer("log_variances").log_variances, tf.float32)
    return {name: tf.exp(-log_variances[i]) for i, name in enumerate(LABELS)}
