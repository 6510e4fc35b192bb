"""The inner steps, compiled from a `Run` (Orbit's `StandardTrainer.train_step` level).

`replica_step` is one optimizer step and reads top to bottom (tape, loss, gradients, clip,
apply); `build_run_steps(run)` returns `run_steps(iterator, first_step, num_steps)`, which takes
that many optimizer steps in one tf.function call (Orbit's steps_per_loop) and returns their
means (and the first non-finite step).
"""
from __future__ import annotations

import tensorflow as tf

from trainer.build import Run
from trainer.config import TrainerConfig
from trainer.heads import CLASSIFICATION
from trainer.step_context import HELPER_KEYS, StepContext
from trainer.updates import apply_update


@tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
def head_losses(heads, targets, outputs, global_batch_size: int) -> dict[str, tf.Tensor]:
    """Each head's loss over this replica's share of the global batch. Unlabeled examples count
    zero; dividing by the global batch makes the sum over replicas the mean (divided once)."""
    losses = {}
    for head in heads:
        loss, _ = head.per_example_loss(targets[head.name], tf.cast(outputs[head.name], tf.float32))
        losses[head.name] = tf.reduce_sum(loss) / global_batch_size
    return losses


@tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
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


@tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
def _finite_figures(step, finite) -> dict:
    return {"nonfinite_step": tf.where(finite, tf.constant(-1, tf.int64), step),
            "skipped_steps": 1.0 - tf.cast(finite, tf.float32)}


def build_replica_step(run: Run):
    config, model, heads, optimizer = run.config, run.model, run.heads, run.optimizer
    replicas, accum = run.strategy.num_replicas_in_sync, config.grad_accum_steps
    float16 = config.precision == "mixed_float16"
    weights_fn, stepped = run.weights_fn, run.stepped

    @tf.autograph.experimental.do_not_convert  # loopline's code; the module's loss_weights is converted on its own
    def replica_step(batches, step, halted):
        """One optimizer step on this replica's share of `grad_accum_steps` batches; `halted`:
        an earlier step of this call was non-finite (nan_policy stop applies nothing after it)."""
        variables = model.trainable_variables
        gradients = [tf.zeros_like(v) for v in variables]
        loss, losses, counts = 0.0, {h.name: 0.0 for h in heads}, {}
        for features, targets in batches:  # unrolled: grad_accum_steps is small
            with tf.GradientTape() as tape:
                outputs = stepped(features, training=True)
                batch_losses = head_losses(heads, targets, outputs, config.batch_size)
                weights = weights_fn(step, batch_losses, model) if weights_fn else {}
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
        return summed, {**update, **_finite_figures(step, finite)}

    return replica_step


def build_user_replica_step(run: Run):
    replicas, config = run.strategy.num_replicas_in_sync, run.config
    custom_step = run.custom_step

    def user_replica_step(batches, step, halted):
        """The module's train_step; the values it reports and its ctx.apply calls feed the NaN guard."""
        ctx = StepContext(run.models, run.optimizers, run.heads, step, config.batch_size, run.rng, batches,
                          config, halted)
        features, targets = batches[0]
        reported = custom_step(ctx, features, targets)
        refuse_keys_the_step_bypassed(ctx, config)
        finite = ctx.all_finite() & tf.reduce_all(
            [tf.reduce_all(tf.math.is_finite(tf.cast(v, tf.float32))) for v in reported.values()])
        if replicas > 1:
            bad = tf.distribute.get_replica_context().all_reduce("sum", 1.0 - tf.cast(finite, tf.float32))
            finite = bad == 0.0
        return reported, {**ctx.figures(), **_finite_figures(step, finite)}

    return user_replica_step


@tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
def combine(total, new):
    """Running totals of a call's steps; the non-finite step kept is the first one."""
    return {k: tf.where(total[k] >= 0, total[k], new[k]) if k == "nonfinite_step" else total[k] + new[k] for k in total}


@tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
def _means(totals, num_steps):
    n = tf.cast(num_steps, tf.float32)
    return {k: v if k in ("nonfinite_step", "skipped_steps") else v / n for k, v in totals.items()}


def build_run_steps(run: Run):
    """`run_steps(iterator, first_step, num_steps)` for this run: fused on one replica, else
    one `strategy.run` per step."""
    return _fused_run_steps(run) if run.fused else _distributed_run_steps(run)


@tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
def _zero_totals(run: Run):
    """The keys replica_step returns, at zero."""
    heads = run.heads
    names = ["loss", *(f"loss/{h.name}" for h in heads), "grad_norm", "learning_rate", "skipped_steps",
             *(f"{h.name}_{c}" for h in heads if h.kind == CLASSIFICATION for c in ("correct", "labelled")),
             *(["loss_scale"] if run.config.precision == "mixed_float16" else [])]
    return {**{k: tf.constant(0.0) for k in names}, "nonfinite_step": tf.constant(-1, tf.int64)}


def _fused_run_steps(run: Run):
    """On one replica nothing needs reducing across devices, so steps and the running totals of
    their metrics compile into one function (with XLA when jit), `unroll_steps` steps in each:
    fewer small ops and fewer XLA launches per step."""
    accum, unroll = run.config.grad_accum_steps, run.config.unroll_steps
    replica_step = build_replica_step(run)

    def fused_steps(count):
        def steps(batches, step, totals):
            for k in range(count):
                summed, averaged = replica_step(batches[k * accum:(k + 1) * accum], step + k,
                                                totals["nonfinite_step"] >= 0)
                totals = combine(totals, {**summed, **averaged})
            return totals

        return tf.function(steps, jit_compile=True, autograph=False) if run.jit else steps

    # Unrolled: whole blocks of unroll steps, then single steps for what is left. Not unrolled: one
    # loop, so the step is traced (and compiled) once, not twice.
    block_step = fused_steps(unroll)
    single_step = fused_steps(1) if unroll > 1 else None

    @tf.function(autograph=False)  # the loops are written as tf.while_loop: nothing here to convert
    def run_steps(iterator, first_step, num_steps):
        def take(steps):
            return tuple(next(iterator) for _ in range(steps * accum))

        def repeat(step_fn, size, start, stop, totals):
            """`step_fn` on `size` steps' batches at a time, for i in [start, stop): steps i * size on."""
            def body(i, totals):
                return i + 1, step_fn(take(size), first_step + tf.cast(i * size, tf.int64), totals)

            return tf.while_loop(lambda i, _: i < stop, body, (start, totals))[1]

        blocks = num_steps // unroll
        totals = repeat(block_step, unroll, tf.constant(0), blocks, _zero_totals(run))
        if single_step is not None:
            totals = repeat(single_step, 1, blocks * unroll, num_steps, totals)
        return _means(totals, num_steps)

    return run_steps


def _distributed_run_steps(run: Run):
    """One `strategy.run` per step, reduced across replicas; a train_step override runs here."""
    strategy, accum = run.strategy, run.config.grad_accum_steps
    stop_on_nan = run.config.nan_policy == "stop"
    inner_step = build_replica_step(run) if run.custom_step is None else build_user_replica_step(run)
    if run.jit:
        inner_step = tf.function(inner_step, jit_compile=True)

    def one_step(iterator, step, halted):
        batches = tuple(next(iterator) for _ in range(accum))
        summed, averaged = strategy.run(inner_step, args=(batches, step, halted))
        out = {k: strategy.reduce("sum", v, axis=None) for k, v in summed.items()}
        for k, v in averaged.items():  # the same on every replica, or averaged
            out[k] = strategy.reduce("mean", v, axis=None)
        return out

    @tf.function
    def run_steps(iterator, first_step, num_steps):
        totals = one_step(iterator, first_step, tf.constant(False))
        for i in tf.range(1, num_steps):
            if stop_on_nan and totals["nonfinite_step"] >= 0:
                break  # nothing is applied after a non-finite step
            totals = combine(totals, one_step(iterator, first_step + tf.cast(i, tf.int64),
                                              totals["nonfinite_step"] >= 0))
        return _means(totals, num_steps)

    return run_steps
