"""How close the exported generator's points are to the data, against two references, and a scatter
plot of both. Run by hand after `loopline train --config examples/gan/loopline.yaml`:

    python examples/gan/measure.py workspace/gan-points/train/gan_points/model/Format-Serving \
        workspace/gan-points/points.csv --scatter docs/examples/gan-points.png

The generator is called through its serving signature (`serving_default`: `noise` in) on seeded
standard-normal noise, as many points as the CSV holds. Per axis, the 1-D Wasserstein distance
to the data's points (scipy) for:
- the generator;
- a collapsed generator, every point at the data's mean (what a GAN that lost all variety makes);
- a normal distribution fitted to the data (the data's own sampling noise: about the best a
  generator can reach with this many points).
"""
from __future__ import annotations

import argparse

import numpy as np

SEED = 7


def generate(model_dir: str, count: int) -> np.ndarray:
    """`[count, 2]` points from the SavedModel's serving signature."""
    import tensorflow as tf

    serve = tf.saved_model.load(model_dir).signatures["serving_default"]
    (name, spec), = serve.structured_input_signature[1].items()
    noise = np.random.default_rng(SEED).standard_normal((count, spec.shape[-1])).astype(np.float32)
    (points,) = serve(**{name: tf.constant(noise)}).values()
    return points.numpy().reshape(count, 2)


def distances(points: np.ndarray, data: np.ndarray) -> list[float]:
    from scipy.stats import wasserstein_distance

    return [float(wasserstein_distance(points[:, i], data[:, i])) for i in range(2)]


def scatter(out: str, data: np.ndarray, generated: np.ndarray) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.2, 3.8), dpi=90)
    ax.scatter(data[:, 0], data[:, 1], s=3, alpha=0.35, label="data")
    ax.scatter(generated[:, 0], generated[:, 1], s=3, alpha=0.35, label="generator")
    ax.set_xlabel("x", fontsize=9)
    ax.set_ylabel("y", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=8, markerscale=3)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", help="the exported generator (<work-dir>/model/Format-Serving)")
    parser.add_argument("data", help="the CSV of points it was trained on (columns x, y)")
    parser.add_argument("--scatter", default=None, help="a PNG to draw the data and the generated points into")
    args = parser.parse_args()
    data = np.loadtxt(args.data, delimiter=",", skiprows=1)
    generated = generate(args.model_dir, len(data))
    rng = np.random.default_rng(SEED)
    fitted = rng.normal(data.mean(axis=0), data.std(axis=0), size=data.shape)
    collapsed = np.repeat(data.mean(axis=0, keepdims=True), len(data), axis=0)
    print(f"data       mean {np.round(data.mean(axis=0), 3)} std {np.round(data.std(axis=0), 3)} ({len(data)} points)")
    print(f"generator  mean {np.round(generated.mean(axis=0), 3)} std {np.round(generated.std(axis=0), 3)}")
    for name, points in (("generator", generated), ("collapsed", collapsed), ("fitted normal", fitted)):
        print(f"{name:14} Wasserstein distance to the data: x {distances(points, data)[0]:.4f}, "
              f"y {distances(points, data)[1]:.4f}")
    if args.scatter:
        scatter(args.scatter, data, generated)
        print(f"wrote {args.scatter}")


if __name__ == "__main__":
    main()
