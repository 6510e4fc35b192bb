"""How the weights move: the optimizer, learning-rate schedule, loss scaling, EMA, per-layer
learning-rate multipliers, and applying an update only when it is finite."""
from __future__ import annotations

import re

import keras
import tensorflow as tf

from trainer.config import TrainerConfig


class FromStepOne(keras.optimizers.schedules.LearningRateSchedule):
    """The optimizer calls its schedule with the updates it has made (0 before the first); the
    loop numbers steps from 1. Update k uses step k's rate, so a warm-up's first update is not 0
    and the rate the loop logs (read from the optimizer before it applies) is the one applied."""

    def __init__(self, schedule):
        self.schedule = schedule

    def __call__(self, iterations):
        return self.schedule(iterations + 1)

    def get_config(self):
        return {"schedule": keras.optimizers.schedules.serialize(self.schedule)}


class Triangular(keras.optimizers.schedules.LearningRateSchedule):
    """Cyclical learning rate (Smith, 2017): from `low` up to `high` and back down every `cycle_steps`."""

    def __init__(self, low: float, high: float, cycle_steps: int):
        self.low, self.high, self.cycle_steps = low, high, cycle_steps

    def __call__(self, step):
        phase = tf.math.floormod(tf.cast(step, tf.float32), float(self.cycle_steps)) / self.cycle_steps
        return self.low + (self.high - self.low) * (1.0 - tf.abs(2.0 * phase - 1.0))

    def get_config(self):
        return {"low": self.low, "high": self.high, "cycle_steps": self.cycle_steps}


def _base_schedule(settings, total_steps: int):
    """`settings`: the trainer config, or one optimizer's section of it (same key names)."""
    rate = settings.learning_rate
    if settings.lr_schedule == "cosine":
        decay = settings.decay_steps or max(total_steps - settings.warmup_steps, 1)
        if settings.warmup_steps:
            return keras.optimizers.schedules.CosineDecay(0.0, decay, warmup_target=rate, warmup_steps=settings.warmup_steps)
        return keras.optimizers.schedules.CosineDecay(rate, decay)
    if settings.lr_schedule == "exponential":
        return keras.optimizers.schedules.ExponentialDecay(rate, settings.decay_steps or 1000, settings.decay_rate)
    if settings.lr_schedule == "triangular":
        return Triangular(settings.min_learning_rate, rate, settings.cycle_steps)
    return keras.optimizers.schedules.ExponentialDecay(rate, 1, 1.0)  # constant, still a schedule


def learning_rate_schedule(settings, total_steps: int) -> FromStepOne:
    """The schedule an optimizer takes: step k's rate for its k-th update."""
    return FromStepOne(_base_schedule(settings, total_steps))


def optimizer_schedules(config: TrainerConfig, names, total_steps: int) -> dict[str, FromStepOne]:
    """A schedule per optimizer name: `trainer.optimizers.<name>` keys override the trainer's for it."""
    unknown = sorted(set(config.optimizers) - set(names))
    if unknown:
        raise ValueError(f"trainer.optimizers names {unknown}, but the module's optimizers are {sorted(names)}")
    schedules = {}
    for name in names:
        overrides = config.optimizers.get(name)
        settings = config.model_copy(update=overrides.model_dump(exclude_none=True)) if overrides else config
        schedules[name] = learning_rate_schedule(settings, total_steps)
    return schedules


def applied_learning_rate(optimizer) -> tf.Tensor:
    """The rate the optimizer's next update uses (read before it applies)."""
    return tf.cast(inner(optimizer).learning_rate, tf.float32)


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
    """The loop's own optimizer: Adam on the schedule, with the config's controls (prepare)."""
    return prepare(keras.optimizers.Adam(schedule), config, variables, ema=True)


def prepare(optimizer: keras.optimizers.Optimizer, config: TrainerConfig, variables, ema: bool):
    """The config's per-optimizer controls on an (unbuilt) optimizer, which is then built: Keras'
    EMA of the weights when `ema` and ema_decay is set, lr_multipliers, and a LossScaleOptimizer
    around it under mixed_float16. Call it under the strategy scope."""
    if ema and config.ema_decay is not None:
        opt = inner(optimizer)
        opt.use_ema, opt.ema_momentum = True, config.ema_decay
    if config.lr_multipliers:
        with_lr_multipliers(inner(optimizer), lr_multiplier_list(variables, config.lr_multipliers))
    if config.precision == "mixed_float16" and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
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


@tf.autograph.experimental.do_not_convert  # no Python control flow on tensors: converting only costs tracing
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
