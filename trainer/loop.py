"""The custom training loop, in Orbit's shape.

`trainer.build.build_run` makes the run (strategy, module, models, optimizers, datasets,
checkpoints) as one object; `trainer.steps.build_run_steps` compiles the inner steps from it
(`steps_per_loop` optimizer steps in one tf.function call); `train` here is the controller: while
below the last step it runs the steps up to the next event, then the actions between calls
(`trainer.actions`: summaries, histograms, evaluation, early stopping, checkpoints).
"""
from __future__ import annotations

import logging
import time
from typing import Sequence

import keras
import tensorflow as tf

from trainer.actions import Actions, EarlyStopping, TrainResult, diagnostics, train_metrics
from trainer.build import Run, build_run
from trainer.config import TrainerConfig
from trainer.features import FeatureKinds
from trainer.split_eval import evaluate
from trainer.step_context import StepContext
from trainer.steps import accuracy_counts, build_run_steps, head_losses
from trainer.summaries import MetricSink

log = logging.getLogger("loopline.trainer")

__all__ = ["EarlyStopping", "MetricSink", "StepContext", "TrainResult", "accuracy_counts", "diagnostics",
           "evaluate", "head_losses", "train"]


def train(
    config: TrainerConfig,
    train_pattern: str,
    eval_pattern: str,
    label: str,
    metric_sinks: Sequence[MetricSink] = (),
    kinds: FeatureKinds | None = None,
    work_dir: str | None = None,
    label_kind: str = "auto",
    max_classes: int | None = None,
    columns_dirs: Sequence[str] = (),
) -> TrainResult:
    """Trains on the train split and evaluates on the eval split (GZIP TFRecord file patterns).
    `label_kind` and `max_classes` are data.label_kind and data.max_classes (`model.head_kinds`).

    With `work_dir`, checkpoints go to `<work_dir>/checkpoints` (and a run there resumes from
    the latest one, unless trainer.resume is false) and TensorBoard summaries to
    `<work_dir>/tensorboard/{train,eval}`. `columns_dirs`: where the splits' columns may
    have been handed over with their records (trainer.handover; the CSV ExampleGen's).
    """
    _configure_runtime(config)
    try:
        run = build_run(config, train_pattern, eval_pattern, label, metric_sinks, work_dir, kinds, label_kind,
                        max_classes, columns_dirs)
        return _control(run)
    finally:
        _reset_runtime(config)


def _control(run: Run) -> TrainResult:
    """Orbit's Controller.train: run the steps up to the next event, then the actions."""
    run_steps = build_run_steps(run)
    step = run.start_step
    actions = Actions(run, step)
    while step < run.total_steps and not actions.stopping.should_stop(step):
        n = actions.next_call_steps(step)
        out = _call_steps(run, run_steps, step, n)
        step += n
        actions.after_loop(step, n, out)
    return actions.finish(step)


def _call_steps(run: Run, run_steps, step: int, n: int) -> dict[str, float]:
    """One call of `n` steps after `step`: advances the checkpointed counters and returns the
    call's metrics as logged; a non-finite step under nan_policy stop raises."""
    config = run.config
    started = time.perf_counter()
    out = run_steps(run.iterator, tf.constant(step + 1, tf.int64), tf.constant(n))
    out = {k: float(v) for k, v in out.items()}
    elapsed = time.perf_counter() - started
    bad = int(out.pop("nonfinite_step", -1))
    if config.nan_policy == "stop" and bad >= 0:
        raise FloatingPointError(f"non-finite loss or gradient at step {bad}; no update was applied from it on "
                                 "and the last checkpoint is before it (trainer.nan_policy=skip skips such steps)")
    run.step_var.assign(step + n)
    run.batches_var.assign_add(n * config.grad_accum_steps)
    if config.nan_policy != "skip":
        out.pop("skipped_steps", None)
    out = train_metrics(out, run.heads)
    out["examples_per_sec"] = n * config.grad_accum_steps * config.batch_size / max(elapsed, 1e-9)
    return out


def _configure_runtime(config: TrainerConfig) -> None:
    keras.utils.set_random_seed(config.seed)  # Python, NumPy and TF
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    tf.config.run_functions_eagerly(config.debug)


def _reset_runtime(config: TrainerConfig) -> None:
    keras.config.set_dtype_policy("float32")
    if config.debug:
        tf.config.run_functions_eagerly(False)
    if config.deterministic:  # process-wide: a later training in this process must not inherit it
        try:
            from tensorflow.python.framework import config as tf_config  # the public API can only turn it on

            tf_config.disable_op_determinism()
        except Exception as exc:  # a private TF function: if it moves, say so and keep going
            log.warning("could not turn TF op determinism off after training (%s: %s)", type(exc).__name__, exc)
