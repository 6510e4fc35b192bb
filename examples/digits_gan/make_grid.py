"""A grid of digits from the exported generator, and figures that say how digit-like they are.
Run by hand after `loopline train --config examples/digits_gan/loopline.yaml` (not by the tests):

    python examples/digits_gan/make_grid.py workspace-digits-gan/train/digits_gan/model/Format-Serving \
        --out docs/examples/digits-gan.png

The generator is called through its serving signature (`serving_default`: `latent` in, `image` out)
on seeded standard-normal latent vectors. The figures compare it with real digits and with a
simple baseline, each pixel drawn on its own from a normal fitted to that pixel over the real
digits (clipped to [0, 1]); a judge, a logistic regression on scikit-learn's digits (even rows;
the odd rows are the "real" set), scores each set:
- confidence: the judge's mean top class probability;
- class entropy: bits of the judge's class histogram (log2(10) = 3.32 when every digit is as common);
- nearest real: the mean pixel distance (L2, pixels in [0, 1]) to the nearest even-row digit.
"""
from __future__ import annotations

import argparse
import json

import numpy as np

LATENT_SEED = 7


def generate(model_dir: str, count: int, seed: int = LATENT_SEED) -> np.ndarray:
    """`[count, 8, 8]` images in [0, 1] from the SavedModel's serving signature."""
    import tensorflow as tf

    serve = tf.saved_model.load(model_dir).signatures["serving_default"]
    latent_size = serve.structured_input_signature[1]["latent"].shape[-1]
    latent = np.random.default_rng(seed).standard_normal((count, latent_size)).astype(np.float32)
    return serve(latent=tf.constant(latent))["image"].numpy()[..., 0]


def grid_png(images: np.ndarray, columns: int, scale: int = 5, gap: int = 2) -> bytes:
    """Images tiled `columns` wide, each scaled up `scale` times (nearest), white gaps, as PNG bytes."""
    import tensorflow as tf

    rows = len(images) // columns
    h, w = images.shape[1] * scale, images.shape[2] * scale
    canvas = np.ones((rows * (h + gap) + gap, columns * (w + gap) + gap), np.float32)
    for i, image in enumerate(images[: rows * columns]):
        r, c = divmod(i, columns)
        big = np.kron(image, np.ones((scale, scale)))
        canvas[gap + r * (h + gap): gap + r * (h + gap) + h, gap + c * (w + gap): gap + c * (w + gap) + w] = 1.0 - big
    pixels = np.round(np.clip(canvas, 0.0, 1.0) * 255).astype(np.uint8)[..., np.newaxis]
    return tf.io.encode_png(pixels).numpy()  # dark digits on white


def tensorboard_tiles(events_dir: str, tag: str = "generated_digits") -> dict[int, np.ndarray]:
    """Step -> the `summary_images` tile TensorBoard shows (`[h, w]` in [0, 1]), from the event files."""
    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    tiles = {}
    for path in sorted(tf.io.gfile.glob(f"{events_dir}/events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                if value.tag == tag:  # the images plugin's tensor: width, height, PNGs
                    png = tf.make_ndarray(value.tensor)[2]
                    tiles[event.step] = tf.io.decode_png(png).numpy()[..., 0] / 255.0
    return tiles


def figures(generated: np.ndarray, seed: int = 0) -> dict[str, dict[str, float]]:
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    digits = load_digits()
    pixels = digits.images.reshape(len(digits.images), -1) / 16.0
    fit, real = pixels[0::2], pixels[1::2]
    judge = LogisticRegression(max_iter=2000).fit(fit, digits.target[0::2])
    rng = np.random.default_rng(seed)
    per_pixel = np.clip(rng.normal(fit.mean(0), fit.std(0), (len(generated), fit.shape[1])), 0.0, 1.0)

    def score(images: np.ndarray) -> dict[str, float]:
        probabilities = judge.predict_proba(images)
        counts = np.bincount(probabilities.argmax(1), minlength=10) / len(images)
        nonzero = counts[counts > 0]
        nearest = np.sqrt(((images[:, None, :] - fit[None, :, :]) ** 2).sum(-1)).min(1)
        return {"confidence": float(probabilities.max(1).mean()), "class_entropy_bits": float(-(nonzero * np.log2(nonzero)).sum()),
                "nearest_real": float(nearest.mean()), "images": len(images)}

    return {"generator": score(generated.reshape(len(generated), -1)), "real (odd rows)": score(real),
            "per-pixel baseline": score(per_pixel),
            "judge_accuracy_on_real": float(judge.score(real, digits.target[1::2]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="the exported generator SavedModel (<work-dir>/model/Format-Serving)")
    parser.add_argument("--out", default="docs/examples/digits-gan.png", help="the grid PNG to write")
    parser.add_argument("--columns", type=int, default=10)
    parser.add_argument("--rows", type=int, default=6)
    parser.add_argument("--samples", type=int, default=1000, help="generated digits the figures are measured on")
    parser.add_argument("--tensorboard", default=None,
                        help="the run's tensorboard/eval folder: also write <out>-epochs.png, its tiles at --epochs")
    parser.add_argument("--epochs", default="1,5,20,50,100,200", help="epochs shown from --tensorboard (one tile each)")
    args = parser.parse_args()
    import tensorflow as tf

    generated = generate(args.model, max(args.samples, args.rows * args.columns))
    with tf.io.gfile.GFile(args.out, "wb") as f:
        f.write(grid_png(generated[: args.rows * args.columns], args.columns))
    print(json.dumps(figures(generated[: args.samples]), indent=2))
    print(f"grid of {args.rows}x{args.columns} generated digits written to {args.out}")
    if args.tensorboard:
        tiles = tensorboard_tiles(args.tensorboard)  # one per evaluation: per epoch by default
        steps = sorted(tiles)
        shown = [steps[int(e) - 1] for e in args.epochs.split(",") if int(e) <= len(steps)]
        strip = args.out.removesuffix(".png") + "-epochs.png"
        with tf.io.gfile.GFile(strip, "wb") as f:
            f.write(grid_png(np.stack([tiles[step] for step in shown]), len(shown), scale=3, gap=8))
        print(f"TensorBoard's tiles at steps {shown} written to {strip}")


if __name__ == "__main__":
    main()
