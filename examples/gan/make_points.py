"""Writes the GAN example's data: 2-D points from one normal distribution (centre (3, -2), standard
deviation 0.3 on each axis, the distribution the tests use), as a CSV with columns x and y.

    python examples/gan/make_points.py workspace/gan-points/points.csv
"""
from __future__ import annotations

import argparse
import os

import numpy as np

CENTER = (3.0, -2.0)
SCALE = 0.3


def write_points(path: str, rows: int, seed: int = 1) -> np.ndarray:
    points = np.random.default_rng(seed).normal(size=(rows, 2)) * SCALE + np.array(CENTER)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    np.savetxt(path, points, fmt="%.5f", delimiter=",", header="x,y", comments="")
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the CSV file to write")
    parser.add_argument("--rows", type=int, default=3000, help="points to write (default 3000)")
    args = parser.parse_args()
    write_points(args.out, args.rows)
    print(f"{args.rows} points written to {args.out}")


if __name__ == "__main__":
    main()
