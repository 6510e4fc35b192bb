"""How the weights move: the optimizer, learning-rate schedule, loss scaling, EMA, per-layer
learning-rate multipliers, and applying an update only when it is finite."""
from __future__ import annotations

import re

import keras
import tensorflow as tf

from trainer.config import TrainerConfig


def learning_rate_schedule(config: TrainerConfig, total_steps: int):
    if config.lr_schedule == "cosine":
        decay = config.decay_steps or max(total_steps - config.warmup_steps, 1)
        if config.warmup_steps:
            return keras.optimizers.schedules.CosineDecay(
                0.0, decay, warmup_target=config.learning_rate, warmup_steps=config.warmup_steps
            )
        return keras.optimizers.schedules.CosineDecay(config.learning_rate, decay)
    if config.lr_schedule == "exponential":
        return keras.optimizers.schedules.ExponentialDecay(config.learning_rate, config.decay_steps or 1000, config.decay_rate)
    return keras.optimizers.schedules.ExponentialDecay(config.learning_rate, 1, 1.0)  # constant, still a schedule


def current_learning_rate(schedule, step) -> tf.Tensor:
    return tf.cast(schedule(step), tf.float32)


def lr_multiplier_list(variables, patterns: dict[str, float]) -> list[float]:
    """Factor per variable, from the first pattern that matches its path (e.g. `encoder|hidden_0`)."""
    compiled = [(re.compile(p), f) for p, f in patterns.items()]
    factors = []
    for variable in variables:
        path = getattr(variable, "path", variable.name)
        factors.append(next((f for p, f in compiled if p.search(path)), 1.0))
    return factors


def with_lr_multipliers(optimizer: keras.optimizers.Optimizer, factors: list[float]):
    """Scales the learning rate each variable's update sees (works for any optimizer, Adam too,
    where scaling the gradient would change nothing)."""
    base = type(optimizer)

    class Scaled(base):
        def update_step(self, gradient, variable, learning_rate):
            factor = factors[self._get_variable_index(variable)]
            if factor != 1.0:
                learning_rate = tf.cast(learning_rate, variable.dtype) * factor
            return super().update_step(gradient, variable, learning_rate)

    Scaled.__name__ = base.__name__
    optimizer.__class__ = Scaled
    return optimizer


def make_optimizer(config: TrainerConfig, schedule, variables) -> keras.optimizers.Optimizer:
    """Adam on the schedule, with Keras' built-in EMA of the weights when `ema_decay` is set and
    a LossScaleOptimizer around it under mixed_float16. Build it under the strategy scope."""
    optimizer = keras.optimizers.Adam(
        schedule, use_ema=config.ema_decay is not None, ema_momentum=config.ema_decay or 0.99
    )
    if config.lr_multipliers:
        with_lr_multipliers(optimizer, lr_multiplier_list(variables, config.lr_multipliers))
    if config.precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build(variables)  # before the first strategy.run (keras-team/keras#23085)
    return optimizer


def inner(optimizer):
    return getattr(optimizer, "inner_optimizer", optimizer)


def ema_values(optimizer) -> list | None:
    """The moving averages, in the order of the trainable variables (None without EMA)."""
    opt = inner(optimizer)
    if not opt.use_ema:
        return None
    return list(opt._model_variables_moving_average)  # Keras keeps them here; no public getter.


def apply_if(finite: tf.Tensor, optimizer, gradients, variables) -> None:
    """`optimizer.apply` only when `finite` (the same on every replica) is true.

    Under MirroredStrategy a cond around a branch that merge_calls must run in cross-replica
    context, so this does what Keras' LossScaleOptimizer does for the same reason.
    """
    strategy = tf.distribute.get_strategy()
    if not tf.distribute.has_strategy() or tf.__internal__.distribute.strategy_supports_no_merge_call():
        tf.cond(finite, lambda: optimizer.apply(gradients, variables) or tf.constant(True), lambda: tf.constant(False))
        return

    def cross_replica(distribution, finite, gradients):
        flag = distribution.experimental_local_results(finite)[0]

        def update():
            distribution.extended.call_for_each_replica(optimizer.apply, args=(gradients, variables))
            return tf.constant(True)

        tf.cond(flag, update, lambda: tf.constant(False))

    del strategy
    tf.distribute.get_replica_context().merge_call(cross_replica, args=(finite, gradients))
