"""A small CNN for the digits image folder (8x8 grayscale PNGs, decoded to [8, 8, 1] floats in
[0, 1] by the input path and by the SavedModel's tf.Example signatures).

The folder names (0-9) are the classes; LABELS declares them classification (they would be
strings anyway, from the folder names).
"""
import keras
import tensorflow as tf

LABELS = {"label": "classification"}


def build_model(ctx):
    inputs = ctx.inputs()  # {"image": [batch, 8, 8, 1]}
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv_0")(inputs["image"])
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv_1")(x)
    x = keras.layers.MaxPooling2D(name="pool")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(64, activation="relu", name="dense")(x)
    outputs = {head.name: head.output_layer(x) for head in ctx.heads}
    return keras.Model(inputs, outputs, name="digits_cnn")


def preprocess(features):
    """Inside the model (exported, and in every TFLite variant): pixels [0, 1] -> [-1, 1]."""
    return {"image": features["image"] * 2.0 - 1.0}


def augment(features, labels, rng):
    """Training batches only: each image's contrast scaled by a random factor in [0.8, 1.2]."""
    image = features["image"]
    scale = tf.random.stateless_uniform(tf.stack([tf.shape(image)[0], 1, 1, 1]), seed=rng, minval=0.8, maxval=1.2)
    return {**features, "image": tf.clip_by_value(image * scale, 0.0, 1.0)}, labels
