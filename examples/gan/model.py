"""A small GAN on 2-D points: two models, two optimizers, one custom `train_step`, trained by
the same loop (strategy, steps_per_loop, checkpoints, summaries, the step's controls through the
StepContext helpers) as any other module.

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
    """One discriminator update, then one generator update, each through ctx.minimize, so the
    loop's controls apply to both (grad_accum_steps, clip_norm, float16 loss scaling, nan_policy;
    lr_multipliers and EMA of the exported generator live in the optimizers)."""
    generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]

    def noise_like(features):
        return ctx.rng.normal([tf.shape(features["x"])[0], NOISE])

    def d_loss(features, targets):
        real = tf.concat([features["x"], features["y"]], axis=-1)
        fake = generator(noise_like(features), training=True)
        per_example = _bce(discriminator(real, training=True), 1.0) + _bce(discriminator(fake, training=True), 0.0)
        return tf.nn.compute_average_loss(per_example, global_batch_size=ctx.global_batch_size)

    def g_loss(features, targets):
        fake = generator(noise_like(features), training=True)
        return tf.nn.compute_average_loss(_bce(discriminator(fake, training=True), 1.0),
                                          global_batch_size=ctx.global_batch_size)

    return {"discriminator_loss": ctx.minimize("discriminator", d_loss),
            "generator_loss": ctx.minimize("generator", g_loss)}
