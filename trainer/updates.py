"""Applying one step's gradients, the same way for the loop's own step and for a module's
`train_step` (through StepContext): all-reduce across replicas, the unscaled global norm,
`clip_norm`, the NaN guard (`nan_policy`), loss scaling and the optimizer's update."""
from __future__ import annotations

import tensorflow as tf

from trainer import optimization
from trainer.config import TrainerConfig


@tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
def apply_update(optimizer, variables, loss, gradients, config: TrainerConfig, step, halted) -> dict[str, tf.Tensor]:
    """`gradients`: this replica's, of `loss` (loss-scaled under mixed_float16). `halted`: an
    earlier step of this call was non-finite (nan_policy stop applies nothing after it).
    Returns grad_norm, learning_rate, finite (and loss_scale under mixed_float16)."""
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    float16 = config.precision == "mixed_float16"
    if config.debug:  # name the first non-finite value (inputs may hold NaN: it means missing)
        tf.debugging.check_numerics(loss, f"loss at step {int(step)}")
        for variable, gradient in zip(variables, gradients):
            tf.debugging.check_numerics(gradient, f"gradient of {variable.path} at step {int(step)}")
    scale = tf.cast(optimizer.dynamic_scale, tf.float32) if float16 else 1.0
    if replicas > 1:  # the global gradient, so its norm and clipping are exact
        gradients = tf.distribute.get_replica_context().all_reduce("sum", gradients)
    grad_norm = tf.linalg.global_norm(gradients) / scale
    if config.clip_norm:  # on the unscaled norm: float16's scaled gradients are clipped at clip_norm * scale
        gradients, _ = tf.clip_by_global_norm(gradients, config.clip_norm * scale, use_norm=grad_norm * scale)
    # float16: the LossScaleOptimizer skips (and halves the scale on) overflowing gradients itself.
    finite = tf.math.is_finite(loss) if float16 else tf.math.is_finite(loss) & tf.math.is_finite(grad_norm)
    if replicas > 1:
        bad = tf.distribute.get_replica_context().all_reduce("sum", 1.0 - tf.cast(finite, tf.float32))
        finite = bad == 0.0
        gradients = [g / replicas for g in gradients]  # Keras' apply sums across replicas again
    learning_rate = optimization.applied_learning_rate(optimizer)  # before apply moves the schedule on
    allowed = finite if config.nan_policy == "skip" else finite & tf.logical_not(halted)
    optimization.apply_if(allowed, optimizer, gradients, variables)
    out = {"grad_norm": grad_norm, "learning_rate": learning_rate, "finite": finite}
    if float16:
        out["loss_scale"] = scale
    return out
