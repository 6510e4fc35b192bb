"""Writes scikit-learn's bundled digits (1,797 8x8 grayscale images, no download) as an image
folder of PNGs: `<out>/<digit>/<index>.png`, for `data.format: image_folder`.

    python examples/digits/make_data.py examples/digits/data            # all 1,797
    python examples/digits/make_data.py /tmp/digits --per-class 30      # a small subset
"""
from __future__ import annotations

import argparse
import os

import numpy as np


def write_digits(out: str, per_class: int | None = None) -> int:
    import tensorflow as tf
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)  # 0..16 -> 0..255
    written: dict[int, int] = {}
    for index, (image, label) in enumerate(zip(pixels, digits.target)):
        label = int(label)
        if per_class is not None and written.get(label, 0) >= per_class:
            continue
        folder = os.path.join(out, str(label))
        tf.io.gfile.makedirs(folder)
        with tf.io.gfile.GFile(os.path.join(folder, f"{index:04d}.png"), "wb") as f:
            f.write(tf.io.encode_png(image[..., np.newaxis]).numpy())
        written[label] = written.get(label, 0) + 1
    return sum(written.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="folder to write <digit>/<index>.png into")
    parser.add_argument("--per-class", type=int, default=None, help="at most this many images per digit")
    args = parser.parse_args()
    print(f"{write_digits(args.out, args.per_class)} images written to {args.out}")


if __name__ == "__main__":
    main()
