"""Which weights are exported: the evaluation with the best value of one validation metric (its
direction from `metric_direction.higher_is_better`), like Orbit's `NewBestMetric`.

The best value, its step, the evaluations since it and a copy of the weights it was measured on
(the export model's: the EMA weights when ema_decay is set) are variables of the checkpoint, so
every checkpoint holds the best so far (none is rotated away) and a resumed run goes on from it.
"""
from __future__ import annotations

import logging
import math

import keras
import tensorflow as tf

from serving.signature_names import signature_name
from trainer.metric_direction import higher_is_better

log = logging.getLogger("loopline.trainer")

AUTO = "auto"
AUTO_PATIENCE = 10  # evaluations without improvement before early stopping, where it is on by "auto"


def resolve_metric(setting: str | None, head_names: list[str], label: str) -> str | None:
    """trainer.early_stopping_metric: `auto` is the loss of data.label's head (of the first head
    when data.label is not one); None without heads, or when set to null."""
    if setting != AUTO:
        return setting
    if not head_names:
        log.info("trainer.early_stopping_metric=auto: the model has no heads, so nothing selects the weights "
                 "and nothing stops early; the last weights are exported (name one of the module's metrics "
                 "to select on it)")
        return None
    head = signature_name(label) if signature_name(label) in head_names else head_names[0]
    return f"{head}_loss"


def resolve_patience(setting: int | str | None, metric_setting: str | None, generic_model: bool) -> int | None:
    """trainer.early_stopping_patience: `auto` stops the generic tabular model, or any model whose
    early_stopping_metric is named, after AUTO_PATIENCE evaluations without improvement; a model
    module on the auto metric trains every epoch (restore_best still picks the best)."""
    if setting != AUTO:
        return setting
    return AUTO_PATIENCE if generic_model or metric_setting not in (AUTO, None) else None


class BestMetric(tf.Module):
    """The best value of `metric` so far, the step it was measured at and the evaluations since."""

    def __init__(self, metric: str):
        super().__init__(name="best_metric")
        self.metric = metric
        self.higher = higher_is_better(metric)
        self.value = tf.Variable(math.nan, dtype=tf.float64, trainable=False, name="value")
        self.step = tf.Variable(-1, dtype=tf.int64, trainable=False, name="step")
        self.stale = tf.Variable(0, dtype=tf.int64, trainable=False, name="stale")

    @property
    def found(self) -> bool:
        return int(self.step.numpy()) >= 0

    def update(self, metrics: dict[str, float], step: int) -> bool:
        """Takes one evaluation's metrics; True when it is the best so far (a NaN never is)."""
        if self.metric not in metrics:
            raise ValueError(f"trainer.early_stopping_metric '{self.metric}' is not an eval "
                             f"metric; eval metrics are {sorted(metrics)}")
        value, best = float(metrics[self.metric]), float(self.value.numpy())
        better = not math.isnan(value) and (math.isnan(best) or (value > best if self.higher else value < best))
        if better:
            self.value.assign(value)
            self.step.assign(step)
            self.stale.assign(0)
        else:
            self.stale.assign_add(1)
        return better


class Selection(tf.Module):
    """The best metric and the weights it was measured on (`keep` on each new best, `restore` at
    the end), for a model whose weights are `model.weights`."""

    def __init__(self, metric: str, model: keras.Model, split: str):
        super().__init__(name="selection")
        self.best = BestMetric(metric)
        self.split = split  # the split it is measured on (trainer.holdout's VALIDATION or EVAL)
        self.weights = [tf.Variable(tf.zeros(w.shape, w.dtype), trainable=False, name=f"best_{i}")
                        for i, w in enumerate(model.weights)]

    def observe(self, metrics: dict[str, float], step: int, model: keras.Model) -> bool:
        """One evaluation of `model`: keeps its weights when it is the best so far."""
        improved = self.best.update(metrics, step)
        if improved:
            for variable, weight in zip(self.weights, model.weights):
                variable.assign(weight)
        return improved

    def restore(self, model: keras.Model) -> bool:
        """Puts the best weights into `model`; False (nothing changed) when no evaluation was a best."""
        if not self.best.found:
            return False
        model.set_weights([v.numpy() for v in self.weights])
        return True

    def describe(self, steps_per_epoch: int) -> dict:
        step = int(self.best.step.numpy())
        return {"metric": self.best.metric, "split": self.split, "value": float(self.best.value.numpy()),
                "step": step, "epoch": math.ceil(step / steps_per_epoch)}
