"""keras-io's GAN on digit images ("Writing a training loop from scratch", its end-to-end DCGAN on
MNIST), scaled to scikit-learn's 8x8 digits and trained by loopline's loop: a generator from a
latent vector, a discriminator on real and generated images, one Adam each (0.0004 and 0.0003,
from `trainer.optimizers.<name>` in loopline.yaml), the discriminator's step then the generator's.

The data is the digits image folder (examples/digits/make_data.py): feature `image`, decoded to
`[8, 8, 1]` floats in [0, 1]; the `label` column is not used. The generator is the exported model:
`serving_default` takes `latent` `[batch, 32]` and answers `image` `[batch, 8, 8, 1]` in [0, 1].
At each evaluation (each epoch) `summary_images` shows 16 digits made from the same 16 latent
vectors in TensorBoard's images dashboard.
"""
import keras
import tensorflow as tf

LABELS = []
EXPORT_MODEL = "generator"
LATENT = 32  # keras-io: 128 for 28x28 images
SIZE = 8
GRID = 4  # summary_images: a GRID x GRID tile of generated digits


def build_models(ctx):
    """keras-io's two convnets, scaled to 8x8. The generator starts at 4x4 and upsamples once (keras-io's
    shape scaled as it is, 2x2 upsampled twice, collapsed here to one image for every latent vector)
    and has batch normalization (its digits were sharper: docs/examples/digits-gan.md)."""
    layers = keras.layers
    latent = keras.Input(shape=(LATENT,), name="latent")
    x = layers.Dense(4 * 4 * 128)(latent)  # keras-io: 7x7x128, doubled twice to 28x28; here 4x4, once to 8x8
    x = layers.BatchNormalization()(x)
    x = layers.LeakyReLU(negative_slope=0.2)(x)
    x = layers.Reshape((4, 4, 128))(x)
    x = layers.Conv2DTranspose(128, 4, strides=2, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.LeakyReLU(negative_slope=0.2)(x)
    image = layers.Conv2D(1, 3, padding="same", activation="sigmoid", dtype="float32", name="image")(x)
    generator = keras.Model(latent, {"image": image}, name="generator")

    real = keras.Input(shape=(SIZE, SIZE, 1), name="image")
    x = layers.Conv2D(64, 3, strides=2, padding="same")(real)  # 8x8 -> 4x4
    x = layers.LeakyReLU(negative_slope=0.2)(x)
    x = layers.Conv2D(128, 3, strides=2, padding="same")(x)  # 4x4 -> 2x2
    x = layers.LeakyReLU(negative_slope=0.2)(x)
    x = layers.GlobalMaxPooling2D()(x)
    discriminator = keras.Model(real, layers.Dense(1, dtype="float32")(x), name="discriminator")
    return {"generator": generator, "discriminator": discriminator}


def build_optimizers(ctx, learning_rate):
    # ctx.learning_rates[name]: trainer.optimizers.<name>.learning_rate (loopline.yaml) over the trainer's keys.
    return {name: keras.optimizers.Adam(ctx.learning_rates[name]) for name in ("generator", "discriminator")}


def _bce(labels, logits):
    return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)[:, 0]


def train_step(ctx, features, targets):
    """keras-io's step: the discriminator learns generated (label 1, plus noise in [0, 0.05)) from
    real (0, plus noise); then the generator learns to make the discriminator say real (0). Both
    through ctx.minimize, so the loop's controls (grad_accum_steps, clip_norm, nan_policy...) apply."""
    generator, discriminator = ctx.models["generator"], ctx.models["discriminator"]

    def latent_like(images):
        return ctx.rng.normal([tf.shape(images)[0], LATENT])

    def d_loss(features, targets):
        real = features["image"]
        fake = generator(latent_like(real), training=True)["image"]
        logits = discriminator(tf.concat([fake, real], axis=0), training=True)
        labels = tf.concat([tf.ones_like(logits[: tf.shape(real)[0]]), tf.zeros_like(logits[tf.shape(real)[0]:])], 0)
        labels += 0.05 * ctx.rng.uniform(tf.shape(labels))  # keras-io: "important trick"
        return tf.nn.compute_average_loss(_bce(labels, logits), global_batch_size=2 * ctx.global_batch_size)

    def g_loss(features, targets):
        fake = generator(latent_like(features["image"]), training=True)["image"]
        logits = discriminator(fake, training=True)
        return tf.nn.compute_average_loss(_bce(tf.zeros_like(logits), logits), global_batch_size=ctx.global_batch_size)

    return {"discriminator_loss": ctx.minimize("discriminator", d_loss),
            "generator_loss": ctx.minimize("generator", g_loss)}


def summary_images(models):
    """The same GRID*GRID latent vectors at every evaluation, tiled into one image."""
    latent = tf.random.stateless_normal([GRID * GRID, LATENT], seed=[28, 5])
    digits = tf.cast(models["generator"](latent, training=False)["image"], tf.float32)
    return {"generated_digits": tile(digits, GRID)}


def tile(images, columns):
    """`[rows * columns, h, w, c]` -> one `[1, rows * (h + 2), columns * (w + 2), c]` image, a
    black border of one pixel around each."""
    images = tf.pad(images, [[0, 0], [1, 1], [1, 1], [0, 0]])
    _, h, w, c = images.shape
    rows = images.shape[0] // columns
    grid = tf.reshape(images[: rows * columns], [rows, columns, h, w, c])
    return tf.reshape(tf.transpose(grid, [0, 2, 1, 3, 4]), [1, rows * h, columns * w, c])
