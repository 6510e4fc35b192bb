"""Building the model: from the user's model module, or a generic tabular model from the data.

A model module is a Python file that may define:
  LABELS: list[str] or dict[str, str]      label columns, one head each (default: data.label); a dict
                                            also declares each head "classification" or "regression"
  build_model(ctx: ModelContext) -> keras.Model   outputs a dict {head name: tensor}
  loss_weights(step, losses[, model]) -> dict   per-head weights from the step (a tf.Tensor), this
                                            batch's per-head losses and the model (e.g. learned
                                            log-variances); `loss_weights(step)` works too
  build_metrics(ctx) -> {name: (keras.metrics.Metric, select)}   stateful eval metrics over the whole
                                            split; select(targets, outputs) -> (y_true, y_pred[, sample_weight])
  metrics(targets, outputs) -> dict         extra eval metrics as batch means (right for plain means
                                            only: use build_metrics for AUC, precision...)
Anything it leaves out falls back to the generic tabular model.

For full control of the step (e.g. a GAN with two optimizers) it may instead define:
  build_models(ctx) -> dict[str, keras.Model]          EXPORT_MODEL names the one to export
  build_optimizers(ctx, learning_rate) -> dict[str, Optimizer]   keyed like the models they train;
                                            ctx.learning_rates[name] is each one's schedule
  train_step(step_ctx, features, targets) -> dict[str, tf.Tensor]
The loop still runs the strategy, steps_per_loop, checkpoints, summaries and evaluation; the
returned values are logged after a SUM over replicas (so scale them by the global batch).
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import logging
import sys
from dataclasses import dataclass, field
from types import ModuleType

import keras
import tensorflow as tf

from trainer.features import FeatureKinds, FeatureStats, TabularEncoder, is_number
from trainer.heads import CLASSIFICATION, REGRESSION, Head

log = logging.getLogger("loopline.trainer")


@dataclass
class ModelContext:
    """What a model builder gets: the input features, their statistics and the heads."""

    kinds: FeatureKinds  # input features only (labels removed)
    stats: FeatureStats
    heads: list[Head]
    hparams: dict = field(default_factory=dict)
    # Per-optimizer learning-rate schedules (trainer.optimizers.<name> over the trainer's keys),
    # keyed like the models build_models returns; build_optimizers may use them.
    learning_rates: dict = field(default_factory=dict)

    def inputs(self) -> dict[str, keras.KerasTensor]:
        return {
            name: keras.Input(shape=(1,), dtype="float32" if is_number(kind) else "string", name=name)
            for name, kind in self.kinds.items()
        }

    def encoder(self) -> TabularEncoder:
        numbers = {k: v for k, v in self.stats.numbers.items() if k in self.kinds}
        strings = {k: v for k, v in self.stats.strings.items() if k in self.kinds}
        return TabularEncoder(numbers, strings, name="encoder")


def build_tabular_model(ctx: ModelContext, hidden_units=(64, 64)) -> keras.Model:
    inputs = ctx.inputs()
    x = ctx.encoder()(inputs)
    for i, units in enumerate(hidden_units):
        x = keras.layers.Dense(units, activation="relu", name=f"hidden_{i}")(x)
    outputs = {head.name: head.output_layer(x) for head in ctx.heads}
    return keras.Model(inputs, outputs, name="tabular")


def split_at_encoder(model: keras.Model, kinds: FeatureKinds) -> tuple[keras.Layer, keras.Model]:
    """(the model's encoder, a model from the encoder's output to the outputs, sharing weights),
    so a compiled (XLA) step can skip the string inputs XLA cannot take."""
    strings = sorted(k for k, v in kinds.items() if v == "string")
    try:
        encoder = model.get_layer("encoder")
        return encoder, keras.Model(encoder.output, model.output, name=f"{model.name}_after_encoder")
    except ValueError as exc:
        raise ValueError(f"trainer.jit_compile: XLA cannot compile the string features {strings}, and the model "
                         f"has no single 'encoder' layer (ctx.encoder()) to run before the compiled step ({exc}); "
                         "turn jit_compile off or feed numbers") from None


def make_head(name: str, kind: str, stats: FeatureStats, expected: str | None = None) -> Head:
    """A head for label column `name`: classification for strings, regression for numbers.
    `expected` is the head kind the model module declares, checked against the data."""
    found = REGRESSION if is_number(kind) else CLASSIFICATION
    if expected is not None and expected != found:
        hint = " (text in a numeric column?)" if expected == REGRESSION else ""
        raise ValueError(f"label '{name}': the model module declares {expected}, but the data holds "
                         f"{'numbers' if is_number(kind) else 'strings'}{hint}")
    if is_number(kind):
        mean, std = stats.numbers[name]
        return Head(name, REGRESSION, mean=mean, std=std, label_dtype=kind)
    vocabulary = stats.strings.get(name) or []
    if len(vocabulary) < 2:
        raise ValueError(f"label '{name}' has {len(vocabulary)} distinct value(s) in the training split; need 2 or more")
    return Head(name, CLASSIFICATION, vocabulary=sorted(vocabulary))


def load_module(path: str | None) -> ModuleType | None:
    if not path:
        return None
    if not tf.io.gfile.exists(path) or tf.io.gfile.isdir(path):
        raise FileNotFoundError(f"trainer.module_file: no such file: {path}")
    with tf.io.gfile.GFile(path, "rb") as f:
        source = f.read()
    digest = hashlib.sha256(source).hexdigest()[:12]
    name = f"loopline_user_module_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    # Run from its source (read through tf.io.gfile, so the file may be on gs://...).
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None, origin=path))
    module.__file__ = path
    sys.modules[name] = module
    exec(compile(source, path, "exec"), module.__dict__)
    return module


def label_names(module: ModuleType | None, default_label: str) -> list[str]:
    labels = getattr(module, "LABELS", None)
    return [default_label] if labels is None else list(labels)  # [] is allowed: no heads (e.g. a GAN)


def module_for_label(module: ModuleType | None, label: str, path: str | None) -> ModuleType | None:
    """A module written for other labels (the default penguins module on a user's CSV) gives way
    to the generic tabular model, so `--set data.path=... --set data.label=...` is enough."""
    labels = getattr(module, "LABELS", None)
    if labels and label not in labels:
        log.warning("trainer.module_file %s predicts %s, not data.label '%s': using the generic tabular model",
                    path, sorted(labels), label)
        return None
    return module


def loss_weights_hook(module: ModuleType | None):
    """The module's `loss_weights` as one call `(step, losses, model) -> {head: weight}`, whether
    it takes (step), (step, losses) or (step, losses, model); None when it has none."""
    hook = getattr(module, "loss_weights", None)
    if hook is None:
        return None
    params = inspect.signature(hook).parameters.values()
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        count = 3
    else:
        count = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    if not 1 <= count <= 3:
        raise ValueError(f"loss_weights must take (step), (step, losses) or (step, losses, model); it takes {count} "
                         "positional arguments")
    return lambda step, losses, model: hook(*(step, losses, model)[:count])


def declared_head_kinds(module: ModuleType | None) -> dict[str, str]:
    """LABELS may be a dict {label: "classification" | "regression"}; a list declares no kinds."""
    labels = getattr(module, "LABELS", None)
    return dict(labels) if isinstance(labels, dict) else {}


def build_models(module: ModuleType | None, ctx: ModelContext) -> dict[str, keras.Model]:
    """Every model the run trains, by name; a plain module has one, "model"."""
    builder = getattr(module, "build_models", None)
    if builder is None:
        return {"model": build_model(module, ctx)}
    models = builder(ctx)
    if not isinstance(models, dict) or not models:
        raise ValueError("build_models(ctx) must return a non-empty dict {name: keras.Model}")
    return models


def build_model(module: ModuleType | None, ctx: ModelContext) -> keras.Model:
    builder = getattr(module, "build_model", None)
    model = builder(ctx) if builder else build_tabular_model(ctx)
    missing = {h.name for h in ctx.heads} - set(model.output_names)
    if missing:
        raise ValueError(f"the model has no output for head(s) {sorted(missing)}; outputs are {model.output_names}")
    return model
