"""Training curves from a Trainer run's TensorBoard event files, as one PNG (the pictures of the
example pages under docs/examples/). Run by hand after a run, not by the tests:

    python examples/plot_curves.py docs/examples/penguins-multitask.png workspace \
        --metrics species_loss,species_accuracy,body_mass_g_mae

Each RUN is a pipeline root (its newest Trainer run is read, as `loopline tensorboard` picks it) or
a Trainer's `tensorboard/` folder; `--label` names several runs in the legend. One panel per
metric; a line per run and per split that logged it (`train`, the held-out rows' `validation`,
`eval`), over optimizer steps. The events are read with TensorBoard's own reader.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up lines say nothing here


def read_scalars(logdir: str) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """(split, tag) -> (steps, values) for every scalar under `<logdir>/<split>/`. The loop logs a
    head's training loss as `loss/<head>` and evaluations as `<head>_loss`: both are named the
    latter here, so one panel shows a head's loss on every split."""
    from tensorboard.backend.event_processing import plugin_event_accumulator
    from tensorboard.util import tensor_util

    out = {}
    for split in sorted(os.listdir(logdir)):
        folder = os.path.join(logdir, split)
        if not os.path.isdir(folder):
            continue
        accumulator = plugin_event_accumulator.EventAccumulator(folder, size_guidance={"tensors": 0})
        accumulator.Reload()
        scalars = set(accumulator.PluginTagToContent("scalars")) if "scalars" in accumulator.ActivePlugins() else set()
        for tag in sorted(scalars):
            events = accumulator.Tensors(tag)
            steps = np.array([e.step for e in events])
            values = np.array([float(tensor_util.make_ndarray(e.tensor_proto)) for e in events])
            name = f"{tag[len('loss/'):]}_loss" if tag.startswith("loss/") else tag
            out[(split, name)] = (steps, values)
    return out


def trainer_logdir(path: str) -> str:
    """`path` itself when it holds the split folders, else the newest Trainer run under a root."""
    if os.path.isdir(os.path.join(path, "train")):
        return path
    from pipeline.tensorboard import newest_logdir

    return newest_logdir(path)


def plot(runs: dict[str, dict], metrics: list[str], out: str, splits: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(metrics), figsize=(3.6 * len(metrics), 3.0), dpi=90, squeeze=False)
    styles = {"train": ":", "validation": "-", "eval": "--"}
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, metric in zip(axes[0], metrics):
        for i, (label, scalars) in enumerate(runs.items()):
            for split in splits:
                if (split, metric) not in scalars:
                    continue
                steps, values = scalars[(split, metric)]
                name = f"{label} {split}" if len(runs) > 1 else split
                ax.plot(steps, values, styles.get(split, "-."), color=colors[i % len(colors)], label=name, lw=1.4,
                        marker="o" if len(steps) == 1 else None, ms=4)  # one evaluation: a dot, not a line
        ax.set_title(metric, fontsize=10)
        ax.set_xlabel("step", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the PNG to write")
    parser.add_argument("runs", nargs="+", help="pipeline roots or Trainer tensorboard/ folders")
    parser.add_argument("--metrics", default="loss", help="comma-separated scalar tags, one panel each")
    parser.add_argument("--label", default=None, help="comma-separated legend names, one per run")
    parser.add_argument("--splits", default="train,validation,eval", help="comma-separated splits to draw")
    args = parser.parse_args()
    labels = args.label.split(",") if args.label else [os.path.basename(os.path.normpath(r)) for r in args.runs]
    if len(labels) != len(args.runs):
        parser.error(f"--label names {len(labels)} runs, {len(args.runs)} given")
    runs = {label: read_scalars(trainer_logdir(run)) for label, run in zip(labels, args.runs)}
    metrics = args.metrics.split(",")
    for metric in metrics:
        if not any(tag == metric for scalars in runs.values() for _, tag in scalars):
            found = sorted({tag for scalars in runs.values() for _, tag in scalars})
            parser.error(f"no run logged {metric!r}; the tags are {', '.join(found)}")
    plot(runs, metrics, args.out, args.splits.split(","))
    print(f"wrote {args.out} ({os.path.getsize(args.out):,} bytes)")


if __name__ == "__main__":
    main()
