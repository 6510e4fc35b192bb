"""The default penguins model: one network, two heads.

- species: classification (the label the pipeline serves and evaluates)
- body_mass_g: regression, an auxiliary task whose weight ramps up over the first steps
  (learn the main task first, then let the body-mass signal shape the shared layers)
"""
import keras
import tensorflow as tf

LABELS = {"species": "classification", "body_mass_g": "regression"}
RAMP_STEPS = 100  # steps over which the regression weight grows from 0 to its full value
REGRESSION_WEIGHT = 0.5


def build_model(ctx):
    inputs = ctx.inputs()
    x = ctx.encoder()(inputs)
    x = keras.layers.Dense(64, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-4), name="shared_0")(x)
    x = keras.layers.Dense(32, activation="relu", name="shared_1")(x)
    outputs = {head.name: head.output_layer(x) for head in ctx.heads}
    return keras.Model(inputs, outputs, name="penguins_multitask")


def loss_weights(step):
    ramp = tf.minimum(tf.cast(step, tf.float32) / RAMP_STEPS, 1.0)
    return {"species": 1.0, "body_mass_g": REGRESSION_WEIGHT * ramp}


def build_metrics(ctx):
    """Mean absolute error of the body-mass head in grams, over the whole split (labelled rows only)."""
    def body_mass(targets, outputs):
        target = targets["body_mass_g"]
        labelled = tf.math.is_finite(target)
        return (tf.reshape(tf.where(labelled, target, 0.0), [-1, 1]), tf.reshape(outputs["body_mass_g"], [-1, 1]),
                tf.cast(labelled, tf.float32))

    return {"body_mass_g_mae": (keras.metrics.MeanAbsoluteError(), body_mass)}
