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
from trainer.features import FeatureKinds, FeatureStats, compute_stats, infer_feature_kinds, is_number, resolve_image_shapes
from serving.signature_names import signature_names_of
from trainer.heads import CLASSIFICATION, Head, HeadTotals
from trainer.inputs import column_batches, load_in_memory, make_dataset, parsed_batches, training_stream
from trainer.model import (
    ModelContext,
    build_models,
    declared_head_kinds,
    label_names,
    load_module,
    head_kinds,
    make_head,
    module_for_data,
    split_at_encoder,
)
from trainer.strategy import is_chief, make_strategy
from trainer.summaries import MetricSink, Progress, Summaries

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


@dataclass
class StepContext:
    """What a user's `train_step(ctx, features, targets)` override gets."""

    models: dict[str, keras.Model]
    optimizers: dict[str, keras.optimizers.Optimizer]
    heads: list[Head]
    step: tf.Tensor  # the optimizer step being taken
    global_batch_size: int  # divide summed per-example losses by this (never by the replica batch)
    rng: tf.random.Generator  # checkpointed with the run


def head_losses(heads, targets, outputs, global_batch_size: int) -> dict[str, tf.Tensor]:
    """Each head's loss over this replica's share of the global batch. Unlabeled examples count
    zero; dividing by the global batch makes the sum over replicas the mean (divided once)."""
    losses = {}
    for head in heads:
        loss, _ = head.per_example_loss(targets[head.name], tf.cast(outputs[head.name], tf.float32))
        losses[head.name] = tf.reduce_sum(loss) / global_batch_size
    return losses


def evaluate(model: keras.Model, heads: list[Head], dataset: tf.data.Dataset, metrics_fn: Callable | None = None) -> dict[str, float]:
    """Loss per head, accuracy (classification) and RMSE (regression) over a whole split, plus
    the module's own `metrics(targets, outputs)` (batch means, weighted by batch size)."""
    if not heads and metrics_fn is None:
        return {}  # nothing to measure (e.g. a GAN module without `metrics`)
    totals = HeadTotals(heads)
    user: dict[str, float] = {}
    examples = 0
    predict = tf.function(lambda features: model(features, training=False), reduce_retracing=True)
    for features, targets in dataset:
        outputs = predict(features)
        size = int(next(iter(features.values())).shape[0])
        examples += size
        totals.add(targets, outputs)
        if metrics_fn is not None:
            for key, value in metrics_fn(targets, outputs).items():
                user[key] = user.get(key, 0.0) + float(value) * size
    metrics = totals.metrics()
    metrics.update({key: value / max(examples, 1) for key, value in user.items()})
    return metrics


def _configure_runtime(config: TrainerConfig) -> None:
    keras.utils.set_random_seed(config.seed)  # Python, NumPy and TF
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    tf.config.run_functions_eagerly(config.debug)


def _reset_runtime(config: TrainerConfig) -> None:
    keras.config.set_dtype_policy("float32")
    if config.debug:
        tf.config.run_functions_eagerly(False)


def _better(metric: str, value: float, best: float | None) -> bool:
    if best is None:
        return True
    larger_is_better = any(word in metric for word in ("accuracy", "auc", "precision", "recall"))
    return value > best if larger_is_better else value < best


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
    the latest one) and TensorBoard summaries to `<work_dir>/tensorboard/{train,eval}`.
    """
    _configure_runtime(config)
    try:
        return _train(config, train_pattern, eval_pattern, label, metric_sinks, work_dir, kinds, label_kind, max_classes)
    finally:
        _reset_runtime(config)


def _train(config, train_pattern, eval_pattern, label, metric_sinks, work_dir, kinds, label_kind, max_classes) -> TrainResult:
    strategy = make_strategy(config.strategy)
    replicas = strategy.num_replicas_in_sync
    if config.jit_compile and replicas > 1 and any("CPU" in d.upper() for d in strategy.extended.worker_devices):
        # The step all-reduces gradients inside the compiled function; XLA has no collectives on CPU.
        raise ValueError(f"trainer.jit_compile does not work with {replicas} replicas on CPU (strategy "
                         f"{config.strategy}: XLA has no cross-replica collectives on CPU); set "
                         "trainer.jit_compile=false or train on one device")
    chief = is_chief(strategy)
    # What the data holds: feature kinds (from the schema when given), statistics, one head per label.
    all_kinds = resolve_image_shapes(dict(kinds), train_pattern) if kinds else infer_feature_kinds(train_pattern)
    signature_names_of(all_kinds)  # two columns with one name in the model: an error naming both
    module = module_for_data(load_module(config.module_file), label, all_kinds, config.module_file)
    custom_step = getattr(module, "train_step", None)
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
    schedule = optimization.learning_rate_schedule(config, total_steps)

    # Models and optimizers under the strategy and precision policy; an export copy in float32.
    keras.config.set_dtype_policy(config.precision)
    with strategy.scope():
        models = build_models(module, ctx)
        if custom_step is not None:
            optimizers = module.build_optimizers(ctx, schedule)
            for name, opt in optimizers.items():
                opt.build(models[name].trainable_variables if name in models else [])
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
        step=step_var, batches_consumed=batches_var, rng=rng,
        **{f"model_{k}": v for k, v in models.items()}, **{f"optimizer_{k}": v for k, v in optimizers.items()},
    )
    step = checkpoints.restore_latest(step_var)

    dataset = training_stream(train_pattern, all_kinds, heads, config.batch_size, config.input, config.seed,
                              skip_batches=int(batches_var.numpy()), columns=columns,
                              augment=getattr(module, "augment", None))
    # XLA cannot compile strings: with jit_compile and string features, the encoder (constants,
    # no weights) runs in tf.data and the compiled step trains the layers after it.
    stepped = model
    if config.jit_compile and custom_step is None and any(not is_number(kind) for kind in kinds.values()):
        encoder, stepped = split_at_encoder(model, kinds)
        dataset = dataset.map(lambda features, targets: (encoder(features), targets),
                              num_parallel_calls=tf.data.AUTOTUNE, deterministic=config.input.deterministic)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    eval_data = make_dataset(eval_pattern, all_kinds, heads, config.batch_size, config.input)
    probe_batch = next(iter(make_dataset(train_pattern, all_kinds, heads, config.batch_size, config.input)))

    optimizer = optimizers.get("model")
    weights_fn = getattr(module, "loss_weights", None)
    float16 = config.precision == "mixed_float16"

    def replica_step(batches, step):
        """One optimizer step on this replica's share of `grad_accum_steps` batches."""
        variables = model.trainable_variables
        gradients = [tf.zeros_like(v) for v in variables]
        loss, losses = 0.0, {h.name: 0.0 for h in heads}
        for features, targets in batches:  # unrolled: grad_accum_steps is small
            with tf.GradientTape() as tape:
                outputs = stepped(features, training=True)
                batch_losses = head_losses(heads, targets, outputs, config.batch_size)
                weights = weights_fn(step) if weights_fn else {}
                terms = [weights.get(h.name, h.weight) * batch_losses[h.name] for h in heads]
                terms += [tf.cast(extra, tf.float32) / replicas for extra in model.losses]  # e.g. regularizers
                batch_loss = tf.add_n(terms) / accum
                scaled = optimizer.scale_loss(batch_loss) if float16 else batch_loss
            gradients = [g + tf.convert_to_tensor(d) for g, d in zip(gradients, tape.gradient(scaled, variables))]
            loss += batch_loss
            losses = {k: losses[k] + batch_losses[k] / accum for k in losses}

        if config.debug:  # name the first non-finite value (inputs may hold NaN: it means missing)
            tf.debugging.check_numerics(loss, f"loss at step {int(step)}")
            for variable, gradient in zip(variables, gradients):
                tf.debugging.check_numerics(gradient, f"gradient of {variable.path} at step {int(step)}")
        scale = tf.cast(optimizer.dynamic_scale, tf.float32) if float16 else 1.0
        if replicas > 1:  # the global gradient, so its norm and clipping are exact
            gradients = tf.distribute.get_replica_context().all_reduce("sum", gradients)
        grad_norm = tf.linalg.global_norm(gradients) / scale
        if config.clip_norm:
            gradients, _ = tf.clip_by_global_norm(gradients, config.clip_norm * scale, use_norm=grad_norm * scale)
        finite = tf.math.is_finite(loss) if float16 else tf.math.is_finite(loss) & tf.math.is_finite(grad_norm)
        if replicas > 1:
            bad = tf.distribute.get_replica_context().all_reduce("sum", 1.0 - tf.cast(finite, tf.float32))
            finite = bad == 0.0
            gradients = [g / replicas for g in gradients]  # Keras' apply sums across replicas again
        if config.nan_policy == "skip":
            optimization.apply_if(finite, optimizer, gradients, variables)
        else:
            optimizer.apply(gradients, variables)

        summed = {"loss": loss, **{f"loss/{k}": v for k, v in losses.items()}}
        averaged = {"grad_norm": grad_norm, "learning_rate": optimization.current_learning_rate(schedule, step),
                    "nonfinite_step": tf.where(finite, tf.constant(-1, tf.int64), step),
                    "skipped_steps": 1.0 - tf.cast(finite, tf.float32)}
        if float16:
            averaged["loss_scale"] = scale
        return summed, averaged

    def user_replica_step(batches, step):
        step_ctx = StepContext(models, optimizers, heads, step, config.batch_size, rng)
        features, targets = batches[0]
        return custom_step(step_ctx, features, targets), {}

    inner_step = user_replica_step if custom_step else replica_step
    if config.jit_compile:
        inner_step = tf.function(inner_step, jit_compile=True)

    def one_step(iterator, step):
        batches = tuple(next(iterator) for _ in range(accum if not custom_step else 1))
        summed, averaged = strategy.run(inner_step, args=(batches, step))
        out = {k: strategy.reduce("sum", v, axis=None) for k, v in summed.items()}
        for k, v in averaged.items():  # the same on every replica, or averaged
            out[k] = strategy.reduce("mean", v, axis=None)
        return out

    def combine(total, new):
        return {k: tf.maximum(total[k], new[k]) if k == "nonfinite_step" else total[k] + new[k] for k in total}

    # On one replica nothing needs reducing across devices, so steps and the running totals of
    # their metrics compile into one function (with XLA when jit_compile), `unroll_steps` steps in
    # each: fewer small ops and fewer XLA launches per step.
    fused = replicas == 1 and not custom_step
    unroll = config.unroll_steps if fused else 1
    if config.unroll_steps > 1 and not fused:
        log.warning("trainer.unroll_steps=%d applies on one replica without a train_step override; running "
                    "one step per call", config.unroll_steps)

    def fused_steps(count):
        def run(batches, step, totals):
            for k in range(count):
                summed, averaged = replica_step(batches[k * accum:(k + 1) * accum], step + k)
                totals = combine(totals, {**summed, **averaged})
            return totals

        return tf.function(run, jit_compile=True) if config.jit_compile else run

    block_step, single_step = (fused_steps(unroll), fused_steps(1)) if fused else (None, None)

    def zero_totals():  # the keys replica_step returns
        totals = {"loss": 0.0, **{f"loss/{h.name}": 0.0 for h in heads}, "grad_norm": 0.0, "learning_rate": 0.0,
                  "skipped_steps": 0.0, **({"loss_scale": 0.0} if float16 else {})}
        return {**{k: tf.constant(v, tf.float32) for k, v in totals.items()}, "nonfinite_step": tf.constant(-1, tf.int64)}

    @tf.function
    def run_steps(iterator, first_step, num_steps):
        """`num_steps` optimizer steps in one call (Orbit's steps_per_loop); returns their means."""
        def take(steps):
            return tuple(next(iterator) for _ in range(steps * accum))

        if fused:  # whole blocks of unroll_steps, then single steps for what is left
            totals = zero_totals()
            blocks = num_steps // unroll
            for i in tf.range(blocks):
                totals = block_step(take(unroll), first_step + tf.cast(i * unroll, tf.int64), totals)
            for i in tf.range(blocks * unroll, num_steps):
                totals = single_step(take(1), first_step + tf.cast(i, tf.int64), totals)
        else:
            totals = one_step(iterator, first_step)
            for i in tf.range(1, num_steps):
                totals = combine(totals, one_step(iterator, first_step + tf.cast(i, tf.int64)))
        n = tf.cast(num_steps, tf.float32)
        return {k: v if k in ("nonfinite_step", "skipped_steps") else v / n for k, v in totals.items()}

    summaries = Summaries(work_dir if chief else None, config.tensorboard, metric_sinks if chief else ())
    progress = Progress(config.progress if chief else "log", total_steps, step)
    eval_every = config.eval_every_steps or steps_per_epoch
    hist_every = config.histogram_every_steps
    metrics_fn = getattr(module, "metrics", None)

    def sync_export_model():
        ema = optimization.ema_values(optimizer) if optimizer is not None and not custom_step else None
        averaged = {id(v): e for v, e in zip(model.trainable_variables, ema)} if ema else {}
        export_model.set_weights([keras.ops.convert_to_numpy(averaged.get(id(v), v)) for v in model.weights])

    metrics: dict[str, float] = {}
    evaluated_at, best, stale = -1, None, 0
    while step < total_steps:
        # Run until the next event (eval, checkpoint, histograms, end), at most steps_per_loop.
        stops = [total_steps, (step // eval_every + 1) * eval_every]
        if checkpoints.every_steps:
            stops.append((step // checkpoints.every_steps + 1) * checkpoints.every_steps)
        if hist_every:
            stops.append((step // hist_every + 1) * hist_every)
        n = min(config.steps_per_loop, min(stops) - step)
        started = time.perf_counter()
        out = run_steps(iterator, tf.constant(step + 1, tf.int64), tf.constant(n))
        out = {k: float(v) for k, v in out.items()}
        elapsed = time.perf_counter() - started
        step += n
        step_var.assign(step)
        batches_var.assign_add(n * (1 if custom_step else accum))

        bad = int(out.pop("nonfinite_step", -1))
        if config.nan_policy == "stop" and bad >= 0:
            raise FloatingPointError(f"non-finite loss or gradient at step {bad}; the last checkpoint is before it "
                                     "(trainer.nan_policy=skip skips such steps)")
        if config.nan_policy != "skip":
            out.pop("skipped_steps", None)
        out["examples_per_sec"] = n * (1 if custom_step else accum) * config.batch_size / max(elapsed, 1e-9)
        summaries.scalars("train", step, out)
        progress.update(step, out)

        if hist_every and step % hist_every == 0 and not custom_step:
            export_model.set_weights([keras.ops.convert_to_numpy(v) for v in model.weights])  # live, not EMA
            histograms, norms = diagnostics(export_model, heads, probe_batch)
            summaries.histograms(step, histograms)
            summaries.scalars("train", step, norms)
        if step % eval_every == 0 or step == total_steps:
            sync_export_model()
            metrics = evaluate(export_model, heads, eval_data, metrics_fn)
            evaluated_at = step
            summaries.scalars("eval", step, {k: v for k, v in metrics.items() if not k.endswith("_examples")})
            epoch = math.ceil(step / steps_per_epoch)
            shown = " ".join(f"{k}={v:.4g}" for k, v in metrics.items() if not k.endswith("_examples"))
            log.info("epoch %d/%d step %d/%d train_loss=%.4g eval %s (%.0f examples/s)",
                     epoch, config.epochs, step, total_steps, out.get("loss", float("nan")), shown, out["examples_per_sec"])
            if config.early_stopping_metric:
                if config.early_stopping_metric not in metrics:
                    raise ValueError(f"trainer.early_stopping_metric '{config.early_stopping_metric}' is not an eval "
                                     f"metric; eval metrics are {sorted(metrics)}")
                value = metrics[config.early_stopping_metric]
                if _better(config.early_stopping_metric, value, best):
                    best, stale = value, 0
                else:
                    stale += 1
                    if stale >= config.early_stopping_patience:
                        log.info("early stopping at step %d: %s has not improved for %d evaluations (best %.4g)",
                                 step, config.early_stopping_metric, stale, best)
                        checkpoints.save(step)
                        break
        if checkpoints.due(step) or step == total_steps:
            checkpoints.save(step)
    progress.close()
    if evaluated_at != step:
        sync_export_model()
        metrics = evaluate(export_model, heads, eval_data, metrics_fn)
    summaries.close()
    return TrainResult(export_model, kinds, heads, stats, metrics, step)


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
