"""What runs between the loop's calls (Orbit's Controller actions): train summaries, histograms,
evaluation on the validation rows (keeping the best weights), early stopping, checkpoints, and at
the end the exported weights' evaluation on the eval split.

`Actions.after_loop(step, n, out)` runs them after each call of `run_steps`, in that order;
`Actions.stopping` says when training stops early; `Actions.finish(step)` ends the run.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import keras
import tensorflow as tf

from trainer import optimization
from trainer.build import Run
from trainer.features import FeatureKinds, FeatureStats
from trainer.heads import CLASSIFICATION, Head
from trainer.selection import BestMetric
from trainer.split_eval import SplitEvaluation, user_metrics
from trainer.steps import head_losses
from trainer.summaries import Progress, Summaries

log = logging.getLogger("loopline.trainer")


@dataclass
class TrainResult:
    model: keras.Model  # float32, holding the weights to export (the EMA ones when ema_decay is set)
    kinds: FeatureKinds  # model inputs (labels removed)
    heads: list[Head]
    stats: FeatureStats
    metrics: dict[str, float]  # the exported weights' evaluation on the eval split
    steps: int  # steps trained
    # The weights exported: step, epoch, and when a metric selected them, metric, split, value, restored.
    exported: dict


class EarlyStopping:
    """Stops once `best` (a BestMetric, updated by each evaluation) has not improved for
    `patience` evaluations; never when either is None. A resumed run that had stopped stops again
    at once (the count is in the checkpoint)."""

    def __init__(self, best: BestMetric | None, patience: int | None):
        self.best, self.patience = best, patience
        self.stopped = False

    def should_stop(self, step: int) -> bool:
        if self.stopped:
            return True
        if self.best is None or self.patience is None or int(self.best.stale.numpy()) < self.patience:
            return False
        self.stopped = True
        log.info("early stopping at step %d: %s has not improved for %d evaluations (best %.4g at step %d)",
                 step, self.best.metric, int(self.best.stale.numpy()), float(self.best.value.numpy()),
                 int(self.best.step.numpy()))
        return True


def steps_to_next_event(step, total_steps, eval_every, checkpoint_every, hist_every, steps_per_loop) -> int:
    """Steps in the next call: up to the next evaluation, checkpoint, histogram or the end, at most steps_per_loop."""
    stops = [total_steps, (step // eval_every + 1) * eval_every]
    if checkpoint_every:
        stops.append((step // checkpoint_every + 1) * checkpoint_every)
    if hist_every:
        stops.append((step // hist_every + 1) * hist_every)
    return min(steps_per_loop, min(stops) - step)


class Actions:
    """The actions of one run, with the state they keep between calls."""

    def __init__(self, run: Run, start_step: int):
        config, chief = run.config, run.chief
        self.run = run
        self.summaries = Summaries(run.work_dir if chief else None, config.tensorboard,
                                   run.metric_sinks if chief else ())
        self.progress = Progress(config.progress if chief else "log", run.total_steps, start_step)
        self.eval_every = config.eval_every_steps or run.steps_per_epoch
        self.hist_every = config.histogram_every_steps
        self.evaluation = self._evaluation(run.selection_data)  # the validation rows (or the eval split)
        # The eval split's evaluation at the end: the periodic one's traced step where the specs agree.
        self.final_evaluation = self.evaluation if run.selection_data is run.eval_data else self.evaluation.on(run.eval_data)
        self.selection = run.selection
        self.stopping = EarlyStopping(run.selection.best if run.selection is not None else None, run.patience)
        self.metrics: dict[str, float] = {}
        self.evaluated_at = -1
        # Each train loss ("loss"; a train_step's "<name>_loss") summed over the steps since the last evaluation, and the steps.
        self.since_eval: dict[str, tuple[float, int]] = {}

    def _evaluation(self, data) -> SplitEvaluation:
        run = self.run
        return SplitEvaluation(run.export_model, run.heads, data, user_metrics(run.module, run.ctx),
                               getattr(run.module, "metrics", None), run.weights_fn)

    @property
    def split(self) -> str:
        """The split the periodic evaluation reads (summaries and log lines are named after it)."""
        return self.selection.split if self.selection is not None else "eval"

    def next_call_steps(self, step: int) -> int:
        return steps_to_next_event(step, self.run.total_steps, self.eval_every, self.run.checkpoints.every_steps,
                                   self.hist_every, self.run.speed.steps_per_loop)

    def after_loop(self, step: int, n: int, out: dict[str, float]) -> None:
        """The actions after a call of n steps that ended at `step`."""
        self.record_train(step, n, out)
        if self.hist_every and step % self.hist_every == 0:
            write_histograms(self.summaries, step, self.run)
        stop = False
        if step % self.eval_every == 0 or step == self.run.total_steps:
            self.evaluate(step, out)
            if self.selection is not None:
                self.selection.observe(self.metrics, step, self.run.export_model)
            stop = self.stopping.should_stop(step)
        if stop or self.run.checkpoints.due(step) or step == self.run.total_steps:
            self.run.checkpoints.save(step)

    def record_train(self, step: int, n: int, out: dict[str, float]) -> None:
        """Train summaries and progress for the call's mean metrics."""
        self.summaries.scalars("train", step, out)
        self.progress.update(step, out)
        for key in [k for k in out if k == "loss" or k.endswith("_loss")]:
            total, steps = self.since_eval.get(key, (0.0, 0))
            self.since_eval[key] = (total + out[key] * n, steps + n)

    def evaluate(self, step: int, out: dict[str, float]) -> None:
        """The periodic evaluation of the weights to export now (the EMA ones where kept)."""
        sync_export_model(self.run)
        self.metrics = self.evaluation(step)
        self.evaluated_at = step
        self.summaries.scalars(self.split, step, {k: v for k, v in self.metrics.items() if not k.endswith("_examples")})
        write_images(self.summaries, self.split, step, self.run)
        run = self.run
        _log_evaluation(self.progress.log, step, run.steps_per_epoch, run.total_steps, run.config.epochs,
                        self.since_eval, self.split, self.metrics, out)
        self.since_eval = {}

    def finish(self, step: int) -> TrainResult:
        """Puts the weights to export in the export model (the best evaluation's, with
        restore_best), evaluates them on the eval split and records the final loss weights."""
        run = self.run
        self.progress.close()
        exported = self._export_weights(step)
        at = exported["step"]
        if not (self.final_evaluation is self.evaluation and self.evaluated_at == at):  # not already measured
            self.metrics = self.final_evaluation(at)
        if run.weights_fn is not None and run.heads:
            _record_final_weights(run.heads, run.weights_fn, at, self.metrics, run.export_model)
        if self.final_evaluation is not self.evaluation:  # else the periodic evaluation logged these at `at`
            self.summaries.scalars("eval", at, {k: v for k, v in self.metrics.items() if not k.endswith("_examples")})
        self.summaries.scalars("exported", at, {k: v for k, v in exported.items() if isinstance(v, (int, float))})
        self.summaries.close()
        return TrainResult(run.export_model, run.kinds, run.heads, run.stats, self.metrics, step, exported)

    def _export_weights(self, step: int) -> dict:
        """Leaves the weights to export in the export model; what they are, in words and numbers."""
        run = self.run
        sync_export_model(run)  # the last weights (their EMA)
        last = {"step": step, "epoch": math.ceil(step / run.steps_per_epoch), "restored": False}
        if self.selection is None:
            log.info("exported the last weights (step %d)", step)
            return last
        best = self.selection.describe(run.steps_per_epoch)
        if not run.config.restore_best or not self.selection.restore(run.export_model):
            why = "trainer.restore_best is false" if run.config.restore_best is False else "no evaluation was a best"
            log.info("exported the last weights (step %d; %s)", step, why)
            return {**last, "metric": best["metric"], "split": best["split"]}
        log.info("exported the weights of epoch %d (step %d of %d): %s %s %.4g, the best of its evaluations",
                 best["epoch"], best["step"], step, best["split"], best["metric"], best["value"])
        return {**best, "restored": True}


def train_metrics(out: dict[str, float], heads: list[Head]) -> dict[str, float]:
    """A call's outputs as logged: accuracy per classification head from its counts."""
    for head in heads:
        if head.kind == CLASSIFICATION:
            correct, labelled = out.pop(f"{head.name}_correct", 0.0), out.pop(f"{head.name}_labelled", 0.0)
            if labelled > 0:
                out[f"{head.name}_accuracy"] = correct / labelled
    return out


def sync_export_model(run: Run) -> None:
    """The export copy takes the live weights (their EMA where the optimizer keeps one)."""
    ema = optimization.ema_values(run.optimizer) if run.optimizer is not None else None
    averaged = {id(v): e for v, e in zip(run.model.trainable_variables, ema)} if ema else {}
    run.export_model.set_weights([keras.ops.convert_to_numpy(averaged.get(id(v), v)) for v in run.model.weights])


def write_images(summaries: Summaries, split: str, step: int, run: Run) -> None:
    """The module's `summary_images(models) -> {tag: [k, h, w, c] in [0, 1]}` (e.g. a GAN's
    generated samples), to TensorBoard's images dashboard at each evaluation (under its split)."""
    hook = getattr(run.module, "summary_images", None)
    if hook is not None and summaries.folder is not None:
        summaries.images(split, step, hook(run.models))


def write_histograms(summaries: Summaries, step: int, run: Run) -> None:
    """Weights (live, not EMA) and, with heads, gradients and per-layer grad norms on a fixed batch."""
    export_model = run.export_model
    export_model.set_weights([keras.ops.convert_to_numpy(v) for v in run.model.weights])
    if not run.heads:  # a train_step module's losses are its own: weights only
        summaries.histograms(step, {f"weights/{v.path}": keras.ops.convert_to_numpy(v)
                                    for v in export_model.trainable_variables})
        return
    histograms, norms = diagnostics(export_model, run.heads, run.probe_batch)
    summaries.histograms(step, histograms)
    summaries.scalars("train", step, norms)


def diagnostics(model: keras.Model, heads: list[Head], batch) -> tuple[dict, dict]:
    """Weight and gradient histograms and per-layer gradient norms, on one fixed training batch."""
    features, targets = batch
    size = int(next(iter(features.values())).shape[0])
    with tf.GradientTape() as tape:
        outputs = model(features, training=False)
        losses = head_losses(heads, targets, outputs, size)
        loss = tf.add_n([h.weight * losses[h.name] for h in heads])
    gradients = tape.gradient(loss, model.trainable_variables)
    histograms, norms = {}, {}
    for variable, gradient in zip(model.trainable_variables, gradients):
        if gradient is None:
            continue
        histograms[f"weights/{variable.path}"] = keras.ops.convert_to_numpy(variable)
        histograms[f"gradients/{variable.path}"] = gradient.numpy()
        norms[f"grad_norm/{variable.path}"] = float(tf.norm(gradient))
    return histograms, norms


def _record_final_weights(heads, weights_fn, step, metrics, model) -> None:
    """Head.weight := the module's loss weight at the final step (on the eval losses), so the
    export records them and the Evaluator computes the same weighted_loss."""
    losses = {h.name: tf.constant(metrics[f"{h.name}_loss"], tf.float32) for h in heads}
    weights = weights_fn(tf.constant(step, tf.int64), losses, model)
    for head in heads:
        head.weight = float(weights.get(head.name, head.weight))


def _log_evaluation(logger, step, steps_per_epoch, total_steps, epochs, since_eval, split, metrics, out) -> None:
    """One line per evaluation: the mean train losses over the steps since the last one (the
    epoch's, with the default eval_every_steps), the split's metrics and the last call's rate."""
    losses = {k: total / steps for k, (total, steps) in since_eval.items()} or {"loss": float("nan")}
    train = " ".join(f"train_{k}={v:.4g}" for k, v in losses.items())
    shown = " ".join(f"{k}={v:.4g}" for k, v in metrics.items() if not k.endswith("_examples"))
    logger.info("epoch %d/%d step %d/%d %s %s %s (%.0f examples/s)", math.ceil(step / steps_per_epoch),
                epochs, step, total_steps, train, split, shown, out["examples_per_sec"])
