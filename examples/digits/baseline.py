"""A simple baseline for the digits CNN on the same split: a logistic regression on the 64 pixels,
fitted on the run's train split and scored on its eval split (ExampleGen's, read back from the
pipeline root). Run by hand after `loopline run --config examples/digits/loopline.yaml`:

    python examples/digits/baseline.py workspace-digits

The CNN trains on the train split less the rows it holds out for validation
(trainer.validation_fraction); the baseline fits on all of it.
"""
from __future__ import annotations

import argparse
import glob
import os

import numpy as np


def read_split(root: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(pixels [n, 64] in [0, 1], labels [n]) of the newest ExampleGen output's split."""
    import tensorflow as tf

    runs = glob.glob(os.path.join(root, "tfx", "*ExampleGen", "examples", "*"))
    if not runs:
        raise SystemExit(f"no ExampleGen output under {root}/tfx: run the pipeline first")
    newest = max(runs, key=lambda path: int(os.path.basename(path)))
    files = glob.glob(os.path.join(newest, f"Split-{split}", "*"))
    pixels, labels = [], []
    for record in tf.data.TFRecordDataset(files, compression_type="GZIP").as_numpy_iterator():
        feature = tf.train.Example.FromString(record).features.feature
        image = tf.io.decode_png(feature["image"].bytes_list.value[0], channels=1).numpy()
        pixels.append(image.reshape(-1) / 255.0)
        labels.append(feature["label"].bytes_list.value[0].decode())
    return np.array(pixels, np.float32), np.array(labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="the digits example's pipeline.root")
    args = parser.parse_args()
    from sklearn.linear_model import LogisticRegression

    train_x, train_y = read_split(args.root, "train")
    eval_x, eval_y = read_split(args.root, "eval")
    model = LogisticRegression(max_iter=5000).fit(train_x, train_y)
    accuracy = float((model.predict(eval_x) == eval_y).mean())
    print(f"logistic regression on pixels: eval accuracy {accuracy:.4f} ({len(train_y)} train, {len(eval_y)} eval rows)")


if __name__ == "__main__":
    main()
