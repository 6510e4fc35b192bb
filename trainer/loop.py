"""The custom training loop: the step reads top to bottom (tape, loss, gradients, apply) and
the outer loop runs epochs, evaluation and logging."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Protocol, Sequence

import keras
import numpy as np
import tensorflow as tf

from trainer.config import TrainerConfig
from trainer.features import FeatureKinds, FeatureStats, compute_stats, infer_feature_kinds
from trainer.heads import CLASSIFICATION, Head
from trainer.inputs import make_dataset, parsed_batches
from trainer.model import ModelContext, build_model, label_names, load_module, make_head

log = logging.getLogger("loopline.trainer")


@dataclass
class TrainResult:
    model: keras.Model
    kinds: FeatureKinds  # model inputs (labels removed)
    heads: list[Head]
    stats: FeatureStats
    metrics: dict[str, float]  # final evaluation on the eval split
    steps: int


def head_losses(heads, targets, outputs):
    """Mean loss per head over the examples that have that head's label."""
    losses = {}
    for head in heads:
        loss, mask = head.per_example_loss(targets[head.name], outputs[head.name])
        losses[head.name] = tf.reduce_sum(loss) / tf.maximum(tf.reduce_sum(mask), 1.0)
    return losses


def evaluate(model: keras.Model, heads: list[Head], dataset: tf.data.Dataset) -> dict[str, float]:
    """Loss per head, accuracy (classification) and RMSE (regression) over a whole split."""
    sums: dict[str, float] = {}

    def add(key, value):
        sums[key] = sums.get(key, 0.0) + float(value)

    predict = tf.function(lambda features: model(features, training=False), reduce_retracing=True)
    for features, targets in dataset:
        outputs = predict(features)
        for head in heads:
            loss, mask = head.per_example_loss(targets[head.name], outputs[head.name])
            add(f"{head.name}/loss_sum", tf.reduce_sum(loss))
            add(f"{head.name}/count", tf.reduce_sum(mask))
            if head.kind == CLASSIFICATION:
                predicted = tf.argmax(outputs[head.name], axis=-1, output_type=tf.int32)
                add(f"{head.name}/correct", tf.reduce_sum(tf.cast(predicted == targets[head.name], tf.float32) * mask))
            else:
                error = (tf.reshape(outputs[head.name], [-1]) - tf.where(mask > 0, targets[head.name], 0.0)) * mask
                add(f"{head.name}/squared_error", tf.reduce_sum(tf.square(error)))
    metrics: dict[str, float] = {}
    total = 0.0
    for head in heads:
        count = max(sums.get(f"{head.name}/count", 0.0), 1.0)
        metrics[f"{head.name}_loss"] = sums.get(f"{head.name}/loss_sum", 0.0) / count
        total += head.weight * metrics[f"{head.name}_loss"]
        if head.kind == CLASSIFICATION:
            metrics[f"{head.name}_accuracy"] = sums.get(f"{head.name}/correct", 0.0) / count
        else:
            metrics[f"{head.name}_rmse"] = float(np.sqrt(sums.get(f"{head.name}/squared_error", 0.0) / count))
        metrics[f"{head.name}_examples"] = count
    metrics["loss"] = total
    return metrics


class MetricSink(Protocol):
    """Receives metrics as training goes (e.g. MLflow); `log` must not raise on outages."""

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def train(
    config: TrainerConfig,
    train_pattern: str,
    eval_pattern: str,
    label: str,
    metric_sinks: Sequence[MetricSink] = (),
    kinds: FeatureKinds | None = None,
) -> TrainResult:
    """Trains on the train split and evaluates on the eval split (GZIP TFRecord file patterns)."""
    keras.utils.set_random_seed(config.seed)
    module = load_module(config.module_file)
    all_kinds = dict(kinds) if kinds else infer_feature_kinds(train_pattern)  # kinds: from the schema
    labels = label_names(module, label)
    for name in labels:
        if name not in all_kinds:
            raise ValueError(f"label column '{name}' is not in the data; columns are {sorted(all_kinds)}")
    stats = compute_stats(parsed_batches(train_pattern, all_kinds), all_kinds)
    heads = [make_head(name, all_kinds[name], stats) for name in labels]
    kinds = {k: v for k, v in all_kinds.items() if k not in labels}
    model = build_model(module, ModelContext(kinds, stats, heads))
    optimizer = keras.optimizers.Adam(config.learning_rate)
    weights_fn = getattr(module, "loss_weights", None)

    train_data = make_dataset(train_pattern, all_kinds, heads, config.batch_size, shuffle=True, seed=config.seed)
    eval_data = make_dataset(eval_pattern, all_kinds, heads, config.batch_size)

    @tf.function
    def train_step(features, targets):
        with tf.GradientTape() as tape:
            outputs = model(features, training=True)
            losses = head_losses(heads, targets, outputs)
            weights = weights_fn(optimizer.iterations) if weights_fn else {}
            loss = tf.add_n([weights.get(h.name, h.weight) * losses[h.name] for h in heads] + list(model.losses))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)
        return loss

    step = 0
    metrics: dict[str, float] = {}
    for epoch in range(1, config.epochs + 1):
        started, seen, loss_sum, batches = time.perf_counter(), 0, 0.0, 0
        for features, targets in train_data:
            loss_sum += float(train_step(features, targets))
            batches += 1
            seen += int(next(iter(features.values())).shape[0])
            step += 1
            if config.max_steps and step >= config.max_steps:
                break
        metrics = evaluate(model, heads, eval_data)
        rate = seen / max(time.perf_counter() - started, 1e-9)
        summary = " ".join(f"{k}={v:.4g}" for k, v in metrics.items() if not k.endswith("_examples"))
        log.info("epoch %d/%d step %d train_loss=%.4g eval %s (%.0f examples/s)",
                 epoch, config.epochs, step, loss_sum / max(batches, 1), summary, rate)
        for sink in metric_sinks:
            sink.log(step, {"train/loss": loss_sum / max(batches, 1), "train/examples_per_sec": rate,
                            **{f"eval/{k}": v for k, v in metrics.items()}})
        if config.max_steps and step >= config.max_steps:
            break
    return TrainResult(model, kinds, heads, stats, metrics, step)
