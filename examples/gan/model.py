"""A small GAN on 2-D points: two models, two optimizers, one custom `train_step`, trained by
the same loop (strategy, steps_per_loop, checkpoints, summaries) as any other module.

The data is any TFRecord split with float features `x` and `y`; no labels.
"""
import keras
import tensorflow as tf

LABELS = []
EXPORT_MODEL = "generator"
NOISE = 4


def build_models(ctx):
    noise = keras.Input(shape=(NOISE,), name="noise")
    h = keras.layers.Dense(32, activation="relu")(noise)
    generator = keras.Model(noise, keras.layers.Dense(2, dtype="float32")(h), name="generator")
    point = keras.Input(shape=(2,), name="point")
    h = keras.layers.Dense(32, activation="relu")(point)
    discriminator = keras.Model(point, keras.layers.Dense(1, dtype="float32")(h), name="discriminator")
    return {"generator": generator, "discriminator": discriminator}


def build_optimizers(ctx, learning_rate):
    # ctx.learning_rates: each optimizer's schedule, trainer.optimizers.<name> over the trainer's
    # learning-rate keys (e.g. trainer.optimizers.discriminator.learning_rate: 0.004).
    return {name: keras.optimizers.Adam(ctx.learning_rates[name], beta_1=0.5) for name in ("generator", "discriminator")}


def _bce(logits, label):
    return tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.fill(tf.shape(logits), label), logits=logits)


def train_step(ctx, features, targets):
    generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]
    real = tf.concat([features["x"], features["y"]], axis=-1)
    noise = ctx.rng.normal([tf.shape(real)[0], NOISE])

    with tf.GradientTape() as tape:
        fake = generator(noise, training=True)
        per_example = _bce(discriminator(real, training=True), 1.0) + _bce(discriminator(fake, training=True), 0.0)
        d_loss = tf.nn.compute_average_loss(per_example, global_batch_size=ctx.global_batch_size)
    grads = tape.gradient(d_loss, discriminator.trainable_variables)
    ctx.optimizers["discriminator"].apply(grads, discriminator.trainable_variables)

    with tf.GradientTape() as tape:
        fake = generator(noise, training=True)
        g_loss = tf.nn.compute_average_loss(_bce(discriminator(fake, training=True), 1.0),
                                            global_batch_size=ctx.global_batch_size)
    grads = tape.gradient(g_loss, generator.trainable_variables)
    ctx.optimizers["generator"].apply(grads, generator.trainable_variables)
    return {"discriminator_loss": d_loss, "generator_loss": g_loss}
