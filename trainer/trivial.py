"""The trivial floor a blessed model must beat: the model that ignores the features, fitted on the
train split (each classification head's class priors, each regression head's mean label) and
scored on the eval split with each head's own loss (`HeadTotals`, as the candidate is scored).

A candidate is refused when a head's loss is not below the trivial one by `evaluator.trivial_margin`
(relative), or when its per-row gain over it is not above 0 at `evaluator.trivial_confidence`
(one-sided: what the eval rows' chance alone could give a model that learned nothing). The majority
class's accuracy is reported beside it, not gated: on imbalanced data a good model may not beat it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Iterable

import numpy as np
import tensorflow as tf

from trainer.heads import CLASSIFICATION, Head, HeadTotals, RowLosses

Batch = tuple[np.ndarray, dict[str, np.ndarray]]  # trainer.evaluation.Batch with its labels parsed


@dataclass(frozen=True)
class Gain:
    """A candidate's loss gain over the trivial model, row by row on the same eval rows: their mean
    (the difference of the two eval losses) and its standard error, which says how much of the gain
    the eval rows' sampling alone could give."""

    rows: int
    mean: float
    standard_error: float

    @classmethod
    def from_sums(cls, rows: float, total: float, squares: float) -> "Gain":
        if rows < 2:
            return cls(int(rows), total / rows if rows else math.nan, math.nan)
        mean = total / rows
        variance = max(squares - rows * mean * mean, 0.0) / (rows - 1)
        return cls(int(rows), mean, math.sqrt(variance / rows))


class TrivialModel:
    """One constant prediction per head: class priors (classification) or the mean (regression)."""

    def __init__(self, heads: list[Head], predictions: dict[str, np.ndarray]):
        self.heads, self.predictions = heads, predictions
        self.totals = HeadTotals(heads)
        self._gain_sums: dict[str, np.ndarray] = {}  # head name: rows, sum of gains, sum of squares

    @classmethod
    def fit(cls, heads: list[Head], batches: Iterable[Batch]) -> "TrivialModel":
        """From the labels (by head name, as `trainer.evaluation.example_batches` parses them) of
        the train split's batches. Raises when a head has no labelled row."""
        sums = {h.name: np.zeros(len(h.vocabulary) if h.kind == CLASSIFICATION else 1) for h in heads}
        counts = {h.name: 0 for h in heads}
        for _, labels in batches:
            for head in heads:
                target = head.encode_label(tf.constant(labels[head.name])).numpy()
                if head.kind == CLASSIFICATION:
                    labelled = target[target >= 0]
                    sums[head.name] += np.bincount(labelled, minlength=len(head.vocabulary))
                else:
                    labelled = target[np.isfinite(target)]
                    sums[head.name] += labelled.astype(np.float64).sum()
                counts[head.name] += labelled.size
        empty = [name for name, n in counts.items() if n == 0]
        if empty:
            raise ValueError(f"no labelled rows for {empty} in the train split")
        return cls(heads, {name: (sums[name] / counts[name]).astype(np.float32) for name in sums})

    @classmethod
    def from_label_summaries(cls, heads: list[Head], summaries: dict[str, dict[str, int] | float]) -> "TrivialModel":
        """The same model from the train split's labels as already summarized, by head name: a
        classification head's rows per class (exact counts), a regression head's mean over its
        finite labels (float64). Raises as fit() does when a head has no labelled row."""
        predictions = {}
        for head in heads:
            summary = summaries[head.name]
            if head.kind == CLASSIFICATION:
                counts = np.array([summary.get(value, 0) for value in head.vocabulary], np.float64)
                if not counts.sum():
                    raise ValueError(f"no labelled rows for {[head.name]} in the train split")
                predictions[head.name] = (counts / counts.sum()).astype(np.float32)
            else:
                predictions[head.name] = np.array([summary], np.float64).astype(np.float32)
        return cls(heads, predictions)

    def score(self, targets: dict[str, tf.Tensor], candidate: RowLosses | None = None) -> None:
        """Scores the constant predictions against one batch's encoded targets (by head name, as
        `Head.encode_label` gives them) and, given the candidate's row losses on the same rows (its
        `HeadTotals.add` answer), adds each row's loss gain of the candidate over them (`gains`)."""
        self.add_scores(*self.batch_scores(targets, candidate))

    @tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
    def batch_scores(self, targets: dict[str, tf.Tensor], candidate: RowLosses | None = None,
                     ) -> tuple[dict[str, tf.Tensor], dict[str, tf.Tensor]]:
        """`score`'s work on one batch, traceable (the Evaluator compiles it with the candidate's):
        the constant predictions' `HeadTotals.batch_sums`, and per head the gains' rows, sum and
        sum of squares (float64) over the rows labelled for it."""
        rows = tf.shape(next(iter(targets.values())))[0]
        constant = {h.name: tf.tile(tf.constant(self.predictions[h.name])[tf.newaxis, :], [rows, 1]) for h in self.heads}
        trivial = self.totals.row_losses(targets, constant)
        gains = {}
        for head in self.heads if candidate is not None else ():
            (trivial_loss, mask), (candidate_loss, _) = trivial[head.name], candidate[head.name]
            gain = tf.cast(tf.boolean_mask(trivial_loss - candidate_loss, mask > 0), tf.float64)
            gains[head.name] = tf.stack([tf.cast(tf.size(gain), tf.float64), tf.reduce_sum(gain),
                                         tf.reduce_sum(tf.square(gain))])
        return self.totals.batch_sums(targets, constant, trivial), gains

    def add_scores(self, sums: dict[str, tf.Tensor], gains: dict[str, tf.Tensor]) -> None:
        """Adds one batch's `batch_scores` (computed eagerly or returned by a compiled step)."""
        self.totals.add_sums(sums)
        for name, values in gains.items():
            self._gain_sums[name] = self._gain_sums.get(name, np.zeros(3)) + np.asarray(values, np.float64)

    def gains(self) -> dict[str, Gain]:
        """Per head, the candidate's per-row loss gain over the trivial model on the scored rows."""
        return {name: Gain.from_sums(*sums) for name, sums in self._gain_sums.items()}

    def metrics(self) -> dict[str, float]:
        """HeadTotals' metrics of the constant predictions: `<head>_loss`, `<head>_accuracy` (the
        majority class's) or `<head>_rmse`, `<head>_examples`."""
        return {k: v for k, v in self.totals.metrics().items() if k not in ("loss", "weighted_loss")}


@dataclass
class Floor:
    """The trivial model's eval metrics and the candidate's per-row gains over it, or why there are
    none (the gate then refuses)."""

    heads: list[Head] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    problem: str | None = None
    gains: dict[str, Gain] = field(default_factory=dict)  # by head name (TrivialModel.gains)

    def checks(self, candidate: dict[str, float], margin: float, confidence: float) -> list[tuple[bool, str]]:
        """(passed, words) per head; a gate that cannot be checked fails."""
        if self.problem is not None:
            return [(False, f"trivial floor not computed: {self.problem}")]
        if not self.heads:
            return [(True, "no trivial floor: no heads")]
        return [self._check(head, candidate, margin, confidence) for head in self.heads]

    def _check(self, head: Head, candidate: dict[str, float], margin: float, confidence: float) -> tuple[bool, str]:
        key, trivial = f"{head.name}_loss", self.metrics.get(f"{head.name}_loss", math.nan)
        if not self.metrics.get(f"{head.name}_examples"):
            return False, f"{key} not compared with the trivial model: no labelled eval rows"
        value = candidate.get(key)
        if value is None or not math.isfinite(value):
            return False, f"{key} not compared with the trivial model: the candidate's is {value}"
        what = "class priors" if head.kind == CLASSIFICATION else "mean"
        gain = 1.0 - value / trivial if trivial > 0 else -math.inf
        text = (f"{key} {value:.4g} vs {trivial:.4g} for the trivial model (the train split's {what}): "
                f"{gain * 100:.1f}% lower, at least {margin * 100:g}% required")
        chance_ok, chance_text = self._beyond_chance(head, confidence)
        text += chance_text
        if head.kind == CLASSIFICATION:
            text += (f"; accuracy {candidate.get(f'{head.name}_accuracy', math.nan):.4g} vs the majority class's "
                     f"{self.metrics[f'{head.name}_accuracy']:.4g} (not gated)")
        else:
            text += f"; RMSE {candidate.get(f'{head.name}_rmse', math.nan):.4g} vs {self.metrics[f'{head.name}_rmse']:.4g}"
        return value <= trivial * (1.0 - margin) and chance_ok, text

    def _beyond_chance(self, head: Head, confidence: float) -> tuple[bool, str]:
        """Whether the per-row gain's one-sided lower confidence bound is above 0, and in words: a
        model that learned nothing beats the trivial one on a small eval split by chance alone."""
        if not confidence:
            return True, ""
        gain = self.gains.get(head.name)
        if gain is None or not math.isfinite(gain.standard_error):
            rows = gain.rows if gain is not None else 0
            return False, f"; not beyond chance: {rows} rows scored beside the trivial model, at least 2 required"
        bound = gain.mean - NormalDist().inv_cdf(confidence) * gain.standard_error
        return bound > 0, (f"; per-row gain {gain.mean:.4g} (standard error {gain.standard_error:.2g}, {gain.rows} rows), "
                           f"{confidence * 100:g}% lower bound {bound:.3g}, above 0 required")
