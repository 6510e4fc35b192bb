"""Evaluating the model being trained on a whole split: each head's loss, accuracy or RMSE
(HeadTotals), the module's stateful `keras.metrics` (`build_metrics`) over the whole split, its
older per-batch `metrics(targets, outputs)`, and `weighted_loss` when it weights its heads."""
from __future__ import annotations

import copy
from typing import Callable

import keras
import tensorflow as tf

from trainer.heads import Head, HeadTotals
from trainer.model import module_code


def user_metrics(module, ctx) -> dict[str, tuple[keras.metrics.Metric, Callable]]:
    """The module's `build_metrics(ctx) -> {name: (keras.metrics.Metric, select)}`, checked;
    `select(targets, outputs)` returns the metric's `(y_true, y_pred)` or `(y_true, y_pred, sample_weight)`."""
    builder = getattr(module, "build_metrics", None)
    if builder is None:
        return {}
    built = builder(ctx)
    for name, entry in (built or {}).items():
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], keras.metrics.Metric)
                and callable(entry[1])):
            raise ValueError(f"build_metrics(ctx)['{name}'] must be (keras.metrics.Metric, select(targets, outputs)); "
                             f"got {entry!r}")
    return dict(built or {})


class SplitEvaluation:
    """Built once per run, so the prediction step is traced once (its signature is the split's
    element spec, unknown batch size included); each call evaluates the whole split again."""

    def __init__(self, model: keras.Model, heads: list[Head], dataset: tf.data.Dataset,
                 metrics: dict | None = None, batch_metrics: Callable | None = None,
                 loss_weights: Callable | None = None):
        self.model, self.heads, self.dataset = model, heads, dataset
        self.metrics = metrics or {}
        self.batch_metrics = batch_metrics  # legacy: batch means, weighted by batch size
        self.loss_weights = loss_weights  # (step, losses, model) -> {head: weight}
        # The module's metric updates and selects, converted by autograph; the step itself is loopline's.
        self._updates = [(module_code(metric.update_state), module_code(select))
                         for metric, select in self.metrics.values()]
        self.step = tf.function(self._step, input_signature=list(dataset.element_spec), autograph=False)

    def on(self, dataset: tf.data.Dataset) -> "SplitEvaluation":
        """The same evaluation of another split: it shares this one's traced step (and its metric
        objects, reset at each call) when the split's elements have the same spec, so the step is
        traced once; otherwise a new evaluation, traced for that spec."""
        if dataset.element_spec != self.dataset.element_spec:
            return SplitEvaluation(self.model, self.heads, dataset, self.metrics, self.batch_metrics, self.loss_weights)
        other = copy.copy(self)
        other.dataset = dataset
        return other

    def _step(self, features, targets):
        outputs = self.model(features, training=False)
        for update, select in self._updates:
            update(*select(targets, outputs))
        return outputs, HeadTotals(self.heads).batch_sums(targets, outputs)  # sums in the graph, not eagerly

    def __call__(self, step: int = 0) -> dict[str, float]:
        if not self.heads and not self.metrics and self.batch_metrics is None:
            return {}  # nothing to measure (e.g. a GAN module without metrics)
        for metric, _ in self.metrics.values():
            metric.reset_state()
        totals = HeadTotals(self.heads)
        batch_sums: dict[str, float] = {}
        examples = 0
        for features, targets in self.dataset:
            outputs, sums = self.step(features, targets)
            totals.add_sums(sums)
            if self.batch_metrics is not None:
                size = int(next(iter(features.values())).shape[0])
                examples += size
                for key, value in self.batch_metrics(targets, outputs).items():
                    batch_sums[key] = batch_sums.get(key, 0.0) + float(value) * size
        results = totals.metrics()
        results.update({key: value / max(examples, 1) for key, value in batch_sums.items()})
        results.update({name: float(metric.result()) for name, (metric, _) in self.metrics.items()})
        if self.loss_weights is not None and self.heads:
            results["weighted_loss"] = self.weighted_loss(step, results)
        return results

    def weighted_loss(self, step: int, results: dict[str, float]) -> float:
        """The heads' eval losses under the weights the module gives at `step` (the model's
        own weights, e.g. learned log-variances, as they are now)."""
        losses = {h.name: tf.constant(results[f"{h.name}_loss"], tf.float32) for h in self.heads}
        weights = self.loss_weights(tf.constant(step, tf.int64), losses, self.model)
        return float(sum(float(weights.get(h.name, h.weight)) * results[f"{h.name}_loss"] for h in self.heads))


def evaluate(model: keras.Model, heads: list[Head], dataset: tf.data.Dataset, metrics_fn: Callable | None = None) -> dict[str, float]:
    """One evaluation of `model` on a split (a run keeps one SplitEvaluation instead)."""
    return SplitEvaluation(model, heads, dataset, batch_metrics=metrics_fn)()
