"""The metrics a Keras `fit()` wrote through its TensorBoard callback (a TFX run_fn's, into
`fn_args.model_run_dir`): each epoch's `epoch_<metric>` scalars, named as Keras' History names
them (`train/`: `<metric>`, `validation/`: `val_<metric>`), and the optimizer steps taken."""
from __future__ import annotations

import os

import tensorflow as tf

_FOLDERS = (("train", ""), ("validation", "val_"))
_EPOCH_PREFIX = "epoch_"


def fit_history(log_dir: str) -> dict[int, dict[str, float]]:
    """{epoch: {metric: value}} from the event files under `log_dir` ({} when there are none)."""
    history: dict[int, dict[str, float]] = {}
    for folder, prefix in _FOLDERS:
        for path in sorted(tf.io.gfile.glob(os.path.join(log_dir, folder, "events.out.tfevents.*"))):
            for event in tf.compat.v1.train.summary_iterator(path):
                for value in event.summary.value:
                    if value.tag.startswith(_EPOCH_PREFIX):
                        number = tf.make_ndarray(value.tensor) if value.HasField("tensor") else value.simple_value
                        history.setdefault(event.step, {})[prefix + value.tag[len(_EPOCH_PREFIX):]] = float(number)
    return history


def final_eval_metrics(history: dict[int, dict[str, float]]) -> dict[str, float]:
    """The last epoch's validation metrics, without Keras' `val_` (the eval split's, as loopline's
    Trainer reports them)."""
    if not history:
        return {}
    last = history[max(history)]
    return {name[len("val_"):]: value for name, value in last.items() if name.startswith("val_")}


def optimizer_steps(log_dir: str) -> int | None:
    """The optimizer's step count at the last evaluation (Keras writes `evaluation_<metric>_vs_iterations`
    at that step); None without a validation pass."""
    steps = [event.step
             for path in tf.io.gfile.glob(os.path.join(log_dir, "validation", "events.out.tfevents.*"))
             for event in tf.compat.v1.train.summary_iterator(path)
             if any(value.tag.endswith("_vs_iterations") for value in event.summary.value)]
    return max(steps) if steps else None
