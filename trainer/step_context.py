"""What a module's own `train_step(ctx, features, targets)` gets: its models and optimizers, and
helpers that give its updates the loop's controls (grad_accum_steps, clip_norm, float16 loss
scaling, nan_policy; lr_multipliers and ema_decay live in the optimizers the loop wraps)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import keras
import tensorflow as tf

from trainer.config import TrainerConfig
from trainer.heads import Head
from trainer.updates import apply_update

# Keys that only the helpers (ctx.accumulate / ctx.apply / ctx.minimize) can apply.
HELPER_KEYS = ("grad_accum_steps", "clip_norm", "precision", "nan_policy")


@dataclass
class StepContext:
    models: dict[str, keras.Model]
    optimizers: dict[str, keras.optimizers.Optimizer]
    heads: list[Head]
    step: tf.Tensor  # the optimizer step being taken
    global_batch_size: int  # divide summed per-example losses by this (never by the replica batch)
    rng: tf.random.Generator  # checkpointed with the run
    batches: tuple = ()  # this step's grad_accum_steps (features, targets) batches
    config: TrainerConfig = field(default_factory=TrainerConfig)
    halted: tf.Tensor | bool = False  # an earlier step of this call was non-finite
    applied: list = field(default_factory=list)  # (name, apply_update's figures) per ctx.apply

    def accumulate(self, name: str, loss_fn: Callable) -> tuple[tf.Tensor, list]:
        """`loss_fn(features, targets)`: this replica's loss on one batch (summed per-example
        losses / global_batch_size). Returns its mean over the step's batches and the summed
        gradients for `models[name]` (loss-scaled under mixed_float16, as ctx.apply expects)."""
        variables = self.models[name].trainable_variables
        optimizer = self.optimizers[name]
        float16 = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        total, gradients = 0.0, [tf.zeros_like(v) for v in variables]
        for features, targets in self.batches:
            with tf.GradientTape() as tape:
                loss = tf.cast(loss_fn(features, targets), tf.float32) / len(self.batches)
                scaled = optimizer.scale_loss(loss) if float16 else loss
            new = tape.gradient(scaled, variables)
            gradients = [g if d is None else g + tf.convert_to_tensor(d) for g, d in zip(gradients, new)]
            total += loss
        return total, gradients

    def apply(self, name: str, loss: tf.Tensor, gradients: list) -> tf.Tensor:
        """Applies `gradients` of `loss` to `models[name]` as the loop's own step does (all-reduce,
        clip_norm on the unscaled norm, the NaN guard, loss scaling); returns whether it was finite."""
        update = apply_update(self.optimizers[name], self.models[name].trainable_variables, loss, gradients,
                              self.config, self.step, self.halted)
        self.applied.append((name, update))
        return update["finite"]

    def minimize(self, name: str, loss_fn: Callable) -> tf.Tensor:
        """accumulate + apply: one update of `models[name]`; returns the loss."""
        loss, gradients = self.accumulate(name, loss_fn)
        self.apply(name, loss, gradients)
        return loss

    def figures(self) -> dict[str, tf.Tensor]:
        """What the helpers measured, for the logs: grad_norm/<name>, learning_rate/<name>..."""
        out = {}
        for name, update in self.applied:
            out.update({f"{key}/{name}": value for key, value in update.items() if key != "finite"})
        return out

    def all_finite(self) -> tf.Tensor:
        return tf.reduce_all([tf.constant(True), *(update["finite"] for _, update in self.applied)])
