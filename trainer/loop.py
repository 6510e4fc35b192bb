"""The custom training loop.

Two levels, as in Orbit: `replica_step` is one optimizer step and reads top to bottom (tape,
loss, gradients, clip, apply); `train` is the outer loop that runs `steps_per_loop` steps inside
one tf.function, then evaluates, checkpoints and writes summaries between those calls.
"""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import keras
import tensorflow as tf

from trainer import optimization
from trainer.checkpoints import Checkpoints
from trainer.config import TrainerConfig
from serving.signature_names import signature_names_of
from trainer.features import FeatureKinds, FeatureStats, compute_stats, infer_feature_kinds, is_number, resolve_image_shapes
from trainer.heads import CLASSIFICATION, Head, higher_is_better
from trainer.inputs import column_batches, load_in_memory, make_dataset, parsed_batches, training_stream
from trainer.model import (
    ModelContext,
    build_models,
    declared_head_kinds,
    head_kinds,
    label_names,
    load_module,
    loss_weights_hook,
    make_head,
    module_for_data,
    split_at_encoder,
)
from trainer.speed import resolve_speed
from trainer.step_context import HELPER_KEYS, StepContext
from trainer.split_eval import SplitEvaluation, evaluate, user_metrics
from trainer.strategy import is_chief, make_strategy, task_name
from trainer.summaries import MetricSink, Progress, Summaries
from trainer.updates import apply_update

log = logging.getLogger("loopline.trainer")

__all__ = ["MetricSink", "StepContext", "TrainResult", "evaluate", "train"]


@dataclass
class TrainResult:
    model: keras.Model  # float32, holding the weights to export (the EMA ones when ema_decay is set)
    kinds: FeatureKinds  # model inputs (labels removed)
    heads: list[Head]
    stats: FeatureStats
    metrics: dict[str, float]  # final evaluation on the eval split
    steps: int


def head_losses(heads, targets, outputs, global_batch_size: int) -> dict[str, tf.Tensor]:
    """Each head's loss over this replica's share of the global batch. Unlabeled examples count
    zero; dividing by the global batch makes the sum over replicas the mean (divided once)."""
    losses = {}
    for head in heads:
        loss, _ = head.per_example_loss(targets[head.name], tf.cast(outputs[head.name], tf.float32))
        losses[head.name] = tf.reduce_sum(loss) / global_batch_size
    return losses


def accuracy_counts(heads, targets, outputs) -> dict[str, tf.Tensor]:
    """Correct and labelled examples of each classification head (training accuracy, summed)."""
    counts = {}
    for head in heads:
        if head.kind == CLASSIFICATION:
            mask = tf.cast(targets[head.name] >= 0, tf.float32)
            predicted = tf.argmax(outputs[head.name], axis=-1, output_type=tf.int32)
            counts[f"{head.name}_correct"] = tf.reduce_sum(tf.cast(predicted == targets[head.name], tf.float32) * mask)
            counts[f"{head.name}_labelled"] = tf.reduce_sum(mask)
    return counts


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


def refuse_keys_an_override_cannot_use(config: TrainerConfig) -> None:
    """At start-up: unroll_steps fuses the loop's own steps; a train_step override is not fused."""
    if config.unroll_steps != 1:
        raise ValueError(f"the module's train_step cannot be unrolled, so trainer.unroll_steps={config.unroll_steps} "
                         "cannot apply to it; leave it at 1")


def refuse_keys_the_step_bypassed(ctx: StepContext, config: TrainerConfig) -> None:
    """When the override is traced (before any update runs): keys only the StepContext helpers
    apply are refused if it updated an optimizer without them, naming the keys and optimizers."""
    defaults = TrainerConfig()
    keys = [k for k in HELPER_KEYS if getattr(config, k) != getattr(defaults, k) and
            not (k == "precision" and config.precision == "mixed_bfloat16")]
    bypassed = sorted(set(ctx.optimizers) - {name for name, _ in ctx.applied})
    if keys and bypassed:
        raise ValueError(f"the module's train_step updates {bypassed} without ctx.apply or ctx.minimize, so "
                         f"{', '.join(f'trainer.{k}' for k in keys)} cannot apply to them; use the StepContext "
                         "helpers or leave these keys at their defaults")


class EarlyStopping:
    """Stops after `patience` evaluations without improvement of `metric` (direction: higher_is_better)."""

    def __init__(self, metric: str | None, patience: int):
        self.metric, self.patience = metric, patience
        self.best, self.stale = None, 0

    def should_stop(self, metrics: dict[str, float], step: int) -> bool:
        if not self.metric:
            return False
        if self.metric not in metrics:
            raise ValueError(f"trainer.early_stopping_metric '{self.metric}' is not an eval "
                             f"metric; eval metrics are {sorted(metrics)}")
        value = metrics[self.metric]
        better = self.best is None or (value > self.best if higher_is_better(self.metric) else value < self.best)
        if better:
            self.best, self.stale = value, 0
            return False
        self.stale += 1
        if self.stale < self.patience:
            return False
        log.info("early stopping at step %d: %s has not improved for %d evaluations (best %.4g)",
                 step, self.metric, self.stale, self.best)
        return True


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
) -> TrainResult:
    """Trains on the train split and evaluates on the eval split (GZIP TFRecord file patterns).
    `label_kind` and `max_classes` are data.label_kind and data.max_classes (`model.head_kinds`).

    With `work_dir`, checkpoints go to `<work_dir>/checkpoints` (and a run there resumes from
    the latest one, unless trainer.resume is false) and TensorBoard summaries to
    `<work_dir>/tensorboard/{train,eval}`.
    """
    _configure_runtime(config)
    try:
        return _train(config, train_pattern, eval_pattern, label, metric_sinks, work_dir, kinds, label_kind, max_classes)
    finally:
        _reset_runtime(config)


@dataclass
class _Steps:
    """Everything the compiled steps close over (built by _train, used by _build_run_steps)."""

    config: TrainerConfig
    strategy: tf.distribute.Strategy
    model: keras.Model
    stepped: keras.Model  # the model, or the part after the encoder when strings stay out of XLA
    heads: list[Head]
    optimizer: keras.optimizers.Optimizer | None
    weights_fn: Callable | None
    jit: bool
    custom_step: Callable | None = None
    step_context: Callable | None = None  # (step, batches, halted) -> StepContext, for custom_step


def _build_replica_step(s: _Steps):
    config, model, heads, optimizer = s.config, s.model, s.heads, s.optimizer
    replicas, accum = s.strategy.num_replicas_in_sync, config.grad_accum_steps
    float16 = config.precision == "mixed_float16"

    def replica_step(batches, step, halted):
        """One optimizer step on this replica's share of `grad_accum_steps` batches; `halted`:
        an earlier step of this call was non-finite (nan_policy stop applies nothing after it)."""
        variables = model.trainable_variables
        gradients = [tf.zeros_like(v) for v in variables]
        loss, losses, counts = 0.0, {h.name: 0.0 for h in heads}, {}
        for features, targets in batches:  # unrolled: grad_accum_steps is small
            with tf.GradientTape() as tape:
                outputs = s.stepped(features, training=True)
                batch_losses = head_losses(heads, targets, outputs, config.batch_size)
                weights = s.weights_fn(step, batch_losses, model) if s.weights_fn else {}
                terms = [tf.cast(weights.get(h.name, h.weight), tf.float32) * batch_losses[h.name] for h in heads]
                terms += [tf.cast(extra, tf.float32) / replicas for extra in model.losses]  # e.g. regularizers
                batch_loss = tf.add_n(terms) / accum
                scaled = optimizer.scale_loss(batch_loss) if float16 else batch_loss
            new = tape.gradient(scaled, variables)
            gradients = [g if d is None else g + tf.convert_to_tensor(d) for g, d in zip(gradients, new)]
            loss += batch_loss
            losses = {k: losses[k] + batch_losses[k] / accum for k in losses}
            counts = {k: counts.get(k, 0.0) + v for k, v in accuracy_counts(heads, targets, outputs).items()}

        update = apply_update(optimizer, variables, loss, gradients, config, step, halted)
        finite = update.pop("finite")

        summed = {"loss": loss, **{f"loss/{k}": v for k, v in losses.items()}, **counts}
        averaged = {**update, "nonfinite_step": tf.where(finite, tf.constant(-1, tf.int64), step),
                    "skipped_steps": 1.0 - tf.cast(finite, tf.float32)}
        return summed, averaged

    return replica_step


def _build_user_replica_step(s: _Steps):
    replicas = s.strategy.num_replicas_in_sync

    def user_replica_step(batches, step, halted):
        """The module's train_step; the values it reports and its ctx.apply calls feed the NaN guard."""
        ctx = s.step_context(step, batches, halted)
        features, targets = batches[0]
        reported = s.custom_step(ctx, features, targets)
        refuse_keys_the_step_bypassed(ctx, s.config)
        finite = ctx.all_finite() & tf.reduce_all(
            [tf.reduce_all(tf.math.is_finite(tf.cast(v, tf.float32))) for v in reported.values()])
        if replicas > 1:
            bad = tf.distribute.get_replica_context().all_reduce("sum", 1.0 - tf.cast(finite, tf.float32))
            finite = bad == 0.0
        return reported, {**ctx.figures(), "nonfinite_step": tf.where(finite, tf.constant(-1, tf.int64), step),
                          "skipped_steps": 1.0 - tf.cast(finite, tf.float32)}

    return user_replica_step


def _combine(total, new):
    """Running totals of a call's steps; the non-finite step kept is the first one."""
    return {k: tf.where(total[k] >= 0, total[k], new[k]) if k == "nonfinite_step" else total[k] + new[k] for k in total}


def _build_run_steps(s: _Steps, unroll: int):
    """`run_steps(iterator, first_step, num_steps)`: that many optimizer steps in one tf.function
    call (Orbit's steps_per_loop), returning their means (and the first non-finite step)."""
    config, strategy, heads = s.config, s.strategy, s.heads
    accum = config.grad_accum_steps
    stop_on_nan = config.nan_policy == "stop"
    replica_step = _build_replica_step(s) if s.custom_step is None else None
    inner_step = replica_step or _build_user_replica_step(s)
    if s.jit:
        inner_step = tf.function(inner_step, jit_compile=True)

    def one_step(iterator, step, halted):
        batches = tuple(next(iterator) for _ in range(accum))
        summed, averaged = strategy.run(inner_step, args=(batches, step, halted))
        out = {k: strategy.reduce("sum", v, axis=None) for k, v in summed.items()}
        for k, v in averaged.items():  # the same on every replica, or averaged
            out[k] = strategy.reduce("mean", v, axis=None)
        return out

    # On one replica nothing needs reducing across devices, so steps and the running totals of
    # their metrics compile into one function (with XLA when jit), `unroll` steps in each: fewer
    # small ops and fewer XLA launches per step.
    fused = strategy.num_replicas_in_sync == 1 and s.custom_step is None

    def fused_steps(count):
        def run(batches, step, totals):
            for k in range(count):
                summed, averaged = replica_step(batches[k * accum:(k + 1) * accum], step + k,
                                                totals["nonfinite_step"] >= 0)
                totals = _combine(totals, {**summed, **averaged})
            return totals

        return tf.function(run, jit_compile=True) if s.jit else run

    block_step, single_step = (fused_steps(unroll), fused_steps(1)) if fused else (None, None)

    def zero_totals():  # the keys replica_step returns
        names = ["loss", *(f"loss/{h.name}" for h in heads), "grad_norm", "learning_rate", "skipped_steps",
                 *(f"{h.name}_{c}" for h in heads if h.kind == CLASSIFICATION for c in ("correct", "labelled")),
                 *(["loss_scale"] if config.precision == "mixed_float16" else [])]
        return {**{k: tf.constant(0.0) for k in names}, "nonfinite_step": tf.constant(-1, tf.int64)}

    @tf.function
    def run_steps(iterator, first_step, num_steps):
        def take(steps):
            return tuple(next(iterator) for _ in range(steps * accum))

        if fused:  # whole blocks of unroll steps, then single steps for what is left
            totals = zero_totals()
            blocks = num_steps // unroll
            for i in tf.range(blocks):
                totals = block_step(take(unroll), first_step + tf.cast(i * unroll, tf.int64), totals)
            for i in tf.range(blocks * unroll, num_steps):
                totals = single_step(take(1), first_step + tf.cast(i, tf.int64), totals)
        else:
            totals = one_step(iterator, first_step, tf.constant(False))
            for i in tf.range(1, num_steps):
                if stop_on_nan and totals["nonfinite_step"] >= 0:
                    break  # nothing is applied after a non-finite step
                totals = _combine(totals, one_step(iterator, first_step + tf.cast(i, tf.int64),
                                                   totals["nonfinite_step"] >= 0))
        n = tf.cast(num_steps, tf.float32)
        return {k: v if k in ("nonfinite_step", "skipped_steps") else v / n for k, v in totals.items()}

    return run_steps


def _train_metrics(out: dict[str, float], heads: list[Head]) -> dict[str, float]:
    """A call's outputs as logged: accuracy per classification head from its counts."""
    for head in heads:
        if head.kind == CLASSIFICATION:
            correct, labelled = out.pop(f"{head.name}_correct", 0.0), out.pop(f"{head.name}_labelled", 0.0)
            if labelled > 0:
                out[f"{head.name}_accuracy"] = correct / labelled
    return out


def _compile_strings_out(model, kinds, dataset, config, jit: bool):
    """XLA cannot compile strings: with jit and string features, the encoder (constants, no
    weights) runs in tf.data and the compiled step trains the layers after it. Returns (the model
    the step calls, the dataset, jit); jit "auto" falls back when the model has no encoder."""
    if not jit or all(is_number(kind) for kind in kinds.values()):
        return model, dataset, jit
    try:
        encoder, stepped = split_at_encoder(model, kinds)
    except ValueError as exc:
        if config.jit_compile is True:
            raise
        log.info("trainer.jit_compile=auto: XLA off (%s)", exc)
        return model, dataset, False
    dataset = dataset.map(lambda features, targets: (encoder(features), targets),
                          num_parallel_calls=tf.data.AUTOTUNE, deterministic=config.input.deterministic)
    return stepped, dataset, jit


def _train(config, train_pattern, eval_pattern, label, metric_sinks, work_dir, kinds, label_kind, max_classes) -> TrainResult:
    strategy = make_strategy(config.strategy)
    replicas = strategy.num_replicas_in_sync
    chief = is_chief(strategy)
    # What the data holds: feature kinds (from the schema when given), statistics, one head per label.
    all_kinds = resolve_image_shapes(dict(kinds), train_pattern) if kinds else infer_feature_kinds(train_pattern)
    signature_names_of(all_kinds)  # two columns with one name in the model: an error naming both
    module = module_for_data(load_module(config.module_file), label, all_kinds, config.module_file)
    custom_step = getattr(module, "train_step", None)
    if custom_step is not None:
        refuse_keys_an_override_cannot_use(config)
    labels = label_names(module, label)
    for name in labels:
        if name not in all_kinds:
            raise ValueError(f"label column '{name}' is not in the data; columns are {sorted(all_kinds)}")
    # A split that fits in memory is parsed once: the statistics and the training stream share it.
    columns = load_in_memory(train_pattern, all_kinds, config.input, config.batch_size)
    label_heads = head_kinds(labels, all_kinds, declared_head_kinds(module), label_kind)
    stats = compute_stats(column_batches(columns) if columns is not None else parsed_batches(train_pattern, all_kinds),
                          all_kinds, classes=[name for name, kind in label_heads.items() if kind == CLASSIFICATION])
    heads = [make_head(name, all_kinds[name], stats, label_heads[name], max_classes) for name in labels]
    kinds = {k: v for k, v in all_kinds.items() if k not in labels}
    if config.batch_size % replicas:
        raise ValueError(f"trainer.batch_size={config.batch_size} must divide evenly across {replicas} replicas")
    ctx = ModelContext(kinds, stats, heads)

    # How long: an epoch is one pass of full batches; a step takes grad_accum_steps batches.
    accum = config.grad_accum_steps
    batches_per_epoch = max(stats.count // config.batch_size, 1)  # stats.count: rows in the train split
    steps_per_epoch = max(batches_per_epoch // accum, 1)
    total_steps = config.epochs * steps_per_epoch
    if config.max_steps:
        total_steps = min(total_steps, config.max_steps)
    on_cpu = replicas > 1 and any("CPU" in d.upper() for d in strategy.extended.worker_devices)
    speed = resolve_speed(config, replicas, on_cpu, custom_step is not None, steps_per_epoch)
    schedule = optimization.learning_rate_schedule(config, total_steps)

    # Models and optimizers under the strategy and precision policy; an export copy in float32.
    keras.config.set_dtype_policy(config.precision)
    with strategy.scope():
        models = build_models(module, ctx)
        if custom_step is not None:
            ctx.learning_rates = optimization.optimizer_schedules(config, list(models), total_steps)
            optimizers = _module_optimizers(module, ctx, schedule, models, config)
        else:
            optimizers = {"model": optimization.make_optimizer(config, schedule, models["model"].trainable_variables)}
        rng = tf.random.Generator.from_seed(config.seed)
    keras.config.set_dtype_policy("float32")
    export_name = getattr(module, "EXPORT_MODEL", None) or next(iter(models))
    model = models[export_name]
    export_model = build_models(module, ctx)[export_name]

    step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    batches_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="batches_consumed")
    checkpoints = Checkpoints(
        os.path.join(work_dir, "checkpoints") if work_dir else None,
        keep=config.keep_checkpoints,
        every_steps=config.checkpoint_every_steps or steps_per_epoch,
        chief=chief,
        task=task_name(strategy),
        step=step_var, batches_consumed=batches_var, rng=rng,
        **{f"model_{k}": v for k, v in models.items()}, **{f"optimizer_{k}": v for k, v in optimizers.items()},
    )
    step = checkpoints.start(config.resume, step_var)

    dataset = training_stream(train_pattern, all_kinds, heads, config.batch_size, config.input, config.seed,
                              skip_batches=int(batches_var.numpy()), columns=columns,
                              augment=getattr(module, "augment", None))
    stepped, dataset, jit = _compile_strings_out(model, kinds, dataset, config, speed.jit_compile and not custom_step)
    jit = jit or (speed.jit_compile and custom_step is not None)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    eval_data = make_dataset(eval_pattern, all_kinds, heads, config.batch_size, config.input)
    probe_batch = next(iter(make_dataset(train_pattern, all_kinds, heads, config.batch_size, config.input)))

    optimizer = optimizers.get(export_name)  # its EMA weights are the ones exported
    weights_fn = loss_weights_hook(module)
    fused = replicas == 1 and not custom_step
    if config.unroll_steps > 1 and not fused:
        log.warning("trainer.unroll_steps=%d applies on one replica without a train_step override; running "
                    "one step per call", config.unroll_steps)
    run_steps = _build_run_steps(
        _Steps(config, strategy, model, stepped, heads, optimizer, weights_fn, jit, custom_step,
               lambda step, batches, halted: StepContext(models, optimizers, heads, step, config.batch_size, rng,
                                                         batches, config, halted)),
        config.unroll_steps if fused else 1)

    summaries = Summaries(work_dir if chief else None, config.tensorboard, metric_sinks if chief else ())
    progress = Progress(config.progress if chief else "log", total_steps, step)
    eval_every = config.eval_every_steps or steps_per_epoch
    hist_every = config.histogram_every_steps
    evaluation = SplitEvaluation(export_model, heads, eval_data, user_metrics(module, ctx),
                                 getattr(module, "metrics", None), weights_fn)
    stopping = EarlyStopping(config.early_stopping_metric, config.early_stopping_patience)

    def sync_export_model():
        ema = optimization.ema_values(optimizer) if optimizer is not None else None
        averaged = {id(v): e for v, e in zip(model.trainable_variables, ema)} if ema else {}
        export_model.set_weights([keras.ops.convert_to_numpy(averaged.get(id(v), v)) for v in model.weights])

    metrics: dict[str, float] = {}
    evaluated_at, since_eval = -1, [0.0, 0]  # train loss summed over steps since the last evaluation, steps
    while step < total_steps:
        # Run until the next event (eval, checkpoint, histograms, end), at most steps_per_loop.
        n = _steps_to_next_event(step, total_steps, eval_every, checkpoints.every_steps, hist_every,
                                 speed.steps_per_loop)
        started = time.perf_counter()
        out = run_steps(iterator, tf.constant(step + 1, tf.int64), tf.constant(n))
        out = {k: float(v) for k, v in out.items()}
        elapsed = time.perf_counter() - started
        bad = int(out.pop("nonfinite_step", -1))
        if config.nan_policy == "stop" and bad >= 0:
            raise FloatingPointError(f"non-finite loss or gradient at step {bad}; no update was applied from it on "
                                     "and the last checkpoint is before it (trainer.nan_policy=skip skips such steps)")
        step += n
        step_var.assign(step)
        batches_var.assign_add(n * accum)
        if config.nan_policy != "skip":
            out.pop("skipped_steps", None)
        out = _train_metrics(out, heads)
        out["examples_per_sec"] = n * accum * config.batch_size / max(elapsed, 1e-9)
        summaries.scalars("train", step, out)
        progress.update(step, out)
        if "loss" in out:
            since_eval = [since_eval[0] + out["loss"] * n, since_eval[1] + n]

        if hist_every and step % hist_every == 0:
            _write_histograms(summaries, step, model, export_model, heads, probe_batch)
        if step % eval_every == 0 or step == total_steps:
            sync_export_model()
            metrics = evaluation(step)
            evaluated_at = step
            summaries.scalars("eval", step, {k: v for k, v in metrics.items() if not k.endswith("_examples")})
            _log_evaluation(step, steps_per_epoch, total_steps, config.epochs, since_eval, metrics, out)
            since_eval = [0.0, 0]
            if stopping.should_stop(metrics, step):
                checkpoints.save(step)
                break
        if checkpoints.due(step) or step == total_steps:
            checkpoints.save(step)
    progress.close()
    if evaluated_at != step:
        sync_export_model()
        metrics = evaluation(step)
    if weights_fn is not None and heads:
        _record_final_weights(heads, weights_fn, step, metrics, export_model)
    summaries.close()
    return TrainResult(export_model, kinds, heads, stats, metrics, step)


def _module_optimizers(module, ctx, schedule, models, config) -> dict:
    """A train_step module's optimizers (ctx.learning_rates set), with the config's per-optimizer controls: lr_multipliers
    and float16 loss scaling on each, EMA on the exported model's (under the strategy scope)."""
    optimizers = module.build_optimizers(ctx, schedule)
    export_name = getattr(module, "EXPORT_MODEL", None) or next(iter(models))
    return {name: optimization.prepare(opt, config, models[name].trainable_variables if name in models else [],
                                       ema=name == export_name) for name, opt in optimizers.items()}


def _write_histograms(summaries, step, model, export_model, heads, probe_batch) -> None:
    """Weights (live, not EMA) and, with heads, gradients and per-layer grad norms on a fixed batch."""
    export_model.set_weights([keras.ops.convert_to_numpy(v) for v in model.weights])
    if not heads:  # a train_step module's losses are its own: weights only
        summaries.histograms(step, {f"weights/{v.path}": keras.ops.convert_to_numpy(v)
                                    for v in export_model.trainable_variables})
        return
    histograms, norms = diagnostics(export_model, heads, probe_batch)
    summaries.histograms(step, histograms)
    summaries.scalars("train", step, norms)


def _record_final_weights(heads, weights_fn, step, metrics, model) -> None:
    """Head.weight := the module's loss weight at the final step (on the eval losses), so the
    export records them and the Evaluator computes the same weighted_loss."""
    losses = {h.name: tf.constant(metrics[f"{h.name}_loss"], tf.float32) for h in heads}
    weights = weights_fn(tf.constant(step, tf.int64), losses, model)
    for head in heads:
        head.weight = float(weights.get(head.name, head.weight))


def _steps_to_next_event(step, total_steps, eval_every, checkpoint_every, hist_every, steps_per_loop) -> int:
    stops = [total_steps, (step // eval_every + 1) * eval_every]
    if checkpoint_every:
        stops.append((step // checkpoint_every + 1) * checkpoint_every)
    if hist_every:
        stops.append((step // hist_every + 1) * hist_every)
    return min(steps_per_loop, min(stops) - step)


def _log_evaluation(step, steps_per_epoch, total_steps, epochs, since_eval, metrics, out) -> None:
    """One line per evaluation: the mean train loss over the steps since the last one (the
    epoch's, with the default eval_every_steps), the eval metrics and the last call's rate."""
    train_loss = since_eval[0] / since_eval[1] if since_eval[1] else float("nan")
    shown = " ".join(f"{k}={v:.4g}" for k, v in metrics.items() if not k.endswith("_examples"))
    log.info("epoch %d/%d step %d/%d train_loss=%.4g eval %s (%.0f examples/s)", math.ceil(step / steps_per_epoch),
             epochs, step, total_steps, train_loss, shown, out["examples_per_sec"])


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
