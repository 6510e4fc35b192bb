"""Building the model: from the user's model module, or a generic tabular model from the data.

A model module is a Python file that may define:
  LABELS: list[str] or dict[str, str]      label columns, one head each (default: data.label); a dict
                                            also declares each head "classification" or "regression"
                                            (this wins over data.label_kind; a contradiction is an error).
                                            The module applies only to data holding every one of them.
  build_model(ctx: ModelContext) -> keras.Model   outputs a dict {head name: tensor}
  loss_weights(step, losses[, model]) -> dict   per-head weights from the step (a tf.Tensor), this
                                            batch's per-head losses and the model (e.g. learned
                                            log-variances); `loss_weights(step)` works too
  build_metrics(ctx) -> {name: (keras.metrics.Metric, select)}   stateful eval metrics over the whole
                                            split; select(targets, outputs) -> (y_true, y_pred[, sample_weight])
  metrics(targets, outputs) -> dict         extra eval metrics as batch means (right for plain means
                                            only: use build_metrics for AUC, precision...)
  preprocess(features) -> features          a transform inside the model (same keys and shapes): the
                                            exported signatures and TFLite run it too
  augment(features, labels, rng) -> (features, labels)   on training batches only; rng is a
                                            stateless seed pair for tf.random.stateless_* ops
Anything it leaves out falls back to the generic tabular model.

For full control of the step (e.g. a GAN with two optimizers) it may instead define:
  build_models(ctx) -> dict[str, keras.Model]          EXPORT_MODEL names the one to export
  build_optimizers(ctx, learning_rate) -> dict[str, Optimizer]   keyed like the models they train;
                                            ctx.learning_rates[name] is each one's schedule
  train_step(step_ctx, features, targets) -> dict[str, tf.Tensor]
  summary_images(models) -> {tag: [k, h, w, c] floats in [0, 1]}   images for TensorBoard at each
                                            evaluation (e.g. a generator's samples)
The loop still runs the strategy, steps_per_loop, checkpoints, summaries and evaluation; the
returned values are logged after a SUM over replicas (so scale them by the global batch). An
exported model without heads (LABELS = []) is served on its own inputs (trainer.export).
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

from trainer.features import (ColumnEmbeddings, FeatureKinds, FeatureStats, TabularEncoder, feature_shape, is_number,
                              is_scalar)
from serving.signature_names import signature_name
from trainer import linear_part
from trainer.heads import CLASSIFICATION, REGRESSION, Head

log = logging.getLogger("loopline.trainer")


@dataclass
class ModelContext:
    """What a model builder gets: the input features, their statistics and the heads."""

    kinds: FeatureKinds  # input features only (labels removed), by column name
    stats: FeatureStats
    heads: list[Head]
    hparams: dict = field(default_factory=dict)
    # Per-optimizer learning-rate schedules (trainer.optimizers.<name> over the trainer's keys),
    # keyed like the models build_models returns; build_optimizers may use them.
    learning_rates: dict = field(default_factory=dict)
    # The generic model's linear part, fitted before the model is built (trainer/linear_part.py).
    linear: linear_part.LinearFit | None = None

    def inputs(self) -> dict[str, keras.KerasTensor]:
        """One input per feature, keyed (and named) by its signature_name."""
        return {
            signature_name(column): keras.Input(shape=feature_shape(kind), dtype="float32" if is_number(kind) else "string",
                                                name=signature_name(column))
            for column, kind in self.kinds.items()
        }

    def encoder(self) -> "Encoding":
        """The generic encoder: `ctx.encoder()(inputs)` is one dense vector per example."""
        names = {signature_name(column) for column in self.kinds}
        numbers = {k: v for k, v in self.stats.numbers.items() if k in names}
        strings = {k: v for k, v in self.stats.strings.items() if k in names}
        lookups = {k: v for k, v in self.stats.lookups.items() if k in names}
        categorical = [k for k in self.stats.categorical if k in names]
        return Encoding(TabularEncoder(numbers, strings, lookups, categorical, name="encoder"))


class Encoding:
    """The `encoder` layer (no weights: under XLA it runs in tf.data, see split_at_encoder), then,
    when text columns of many values are looked up, the `embeddings` layer (ColumnEmbeddings)."""

    def __init__(self, encoder: TabularEncoder):
        self.encoder = encoder

    def __call__(self, inputs):
        return self.embed(self.encoder(inputs))

    def embed(self, encoded):
        """The encoder's output with its lookup indices embedded (ColumnEmbeddings), if it has any."""
        if not self.encoder.lookups:
            return encoded
        sizes = [len(vocabulary) for vocabulary in self.encoder.lookups.values()]
        return ColumnEmbeddings(sizes, name="embeddings")(encoded)


# The generic model's defaults, measured against scikit-learn's by `make bench BENCH=quality`
# (docs/model-quality.md): two ReLU layers, an L2 penalty on their kernels (weights stay small on
# a few hundred rows), the best epoch on held-out rows and early stopping (trainer.selection).
HIDDEN_UNITS = (64, 64)
L2 = 1e-3
# trainer.hparams keys the generic model reads (what tuner.search_space may name as hparams.<key>).
GENERIC_HPARAMS = {"units": HIDDEN_UNITS[0], "layers": len(HIDDEN_UNITS), "l2": L2, "dropout": 0.0}


def build_tabular_model(ctx: ModelContext, hidden_units=None) -> keras.Model:
    """`hidden_units` (a tuple of widths) wins over ctx.hparams' `units` x `layers`."""
    hp = {**GENERIC_HPARAMS, **ctx.hparams}
    inputs = ctx.inputs()
    encoding = ctx.encoder()
    encoded = encoding.encoder(inputs)  # the linear part reads the lookups' indices, the network their embeddings
    x = encoding.embed(encoded)
    for i, units in enumerate(hidden_units or (int(hp["units"]),) * int(hp["layers"])):
        x = keras.layers.Dense(units, activation="relu", kernel_regularizer=keras.regularizers.L2(float(hp["l2"])),
                               name=f"hidden_{i}")(x)
        if float(hp["dropout"]) > 0:
            x = keras.layers.Dropout(float(hp["dropout"]), name=f"dropout_{i}")(x)
    part = ctx.linear
    if part is None:
        return keras.Model(inputs, {head.name: head.output_layer(x) for head in ctx.heads}, name="tabular")
    linear_inputs = linear_part.inputs_of(part)(encoded)
    outputs = {head.name: linear_part.head_output(head, x, encoded, linear_inputs, part) if head.name in part.weights
               else head.output_layer(x) for head in ctx.heads}
    return keras.Model(inputs, outputs, name="tabular")


def split_at_encoder(model: keras.Model, kinds: FeatureKinds) -> tuple[keras.Layer, keras.Model]:
    """(the model's encoder, a model from the encoder's output to the outputs, sharing weights),
    so a compiled (XLA) step can skip the string inputs XLA cannot take."""
    strings = sorted(k for k, v in kinds.items() if not is_number(v))
    try:
        encoder = model.get_layer("encoder")
        return encoder, keras.Model(encoder.output, model.output, name=f"{model.name}_after_encoder")
    except ValueError as exc:
        raise ValueError(f"trainer.jit_compile: XLA cannot compile the string features {strings}, and the model "
                         f"has no single 'encoder' layer (ctx.encoder()) to run before the compiled step ({exc}); "
                         "turn jit_compile off or feed numbers") from None


def head_kinds(labels: list[str], kinds: FeatureKinds, declared: dict[str, str], label_kind: str) -> dict[str, str]:
    """Each label's head kind: the module's declaration, else data.label_kind, else auto
    (classification for strings, regression for numbers). Errors name the label."""
    out = {}
    for name in labels:
        kind = kinds[name]
        if not is_scalar(kind):
            raise ValueError(f"label '{name}' is a {kind} feature; a label holds one value per example")
        wanted = declared.get(name)
        if wanted and label_kind != "auto" and wanted != label_kind:
            raise ValueError(f"label '{name}': the model module declares {wanted}, but data.label_kind is {label_kind}")
        who = "the model module declares" if wanted else "data.label_kind is"
        wanted = wanted or (label_kind if label_kind != "auto" else None)
        found = REGRESSION if is_number(kind) else CLASSIFICATION
        if wanted == REGRESSION and found == CLASSIFICATION:
            raise ValueError(f"label '{name}': {who} regression, but the data holds strings "
                             "(text in a numeric column?)")
        out[name] = wanted or found
    return out


def make_head(name: str, kind: str, stats: FeatureStats, head_kind: str | None = None,
              max_classes: int | None = None) -> Head:
    """A head for label column `name` of the given head kind (`head_kinds`). A classification
    head's vocabulary is every class of the training split, or the `max_classes` most frequent
    (the rows of the others are counted and logged: they are left out of loss and accuracy)."""
    head_kind = head_kind or head_kinds([name], {name: kind}, {}, "auto")[name]
    column, name = name, signature_name(name)
    kept = None if column == name else column
    if head_kind == REGRESSION:
        mean, std = stats.numbers[name]
        return Head(name, REGRESSION, mean=mean, std=std, label_dtype=kind, column=kept)
    counts = stats.classes.get(name) or {value: 1 for value in stats.strings.get(name, [])}
    if len(counts) < 2:
        raise ValueError(f"label '{column}' has {len(counts)} distinct value(s) in the training split; need 2 or more")
    ranked = sorted(counts, key=lambda v: (-counts[v], v))
    if max_classes is not None and len(ranked) > max_classes:
        dropped = sum(counts[v] for v in ranked[max_classes:])
        log.warning("label '%s': data.max_classes=%d keeps %d of %d classes; %d training row(s) of the other "
                    "classes are left out of loss and accuracy", column, max_classes, max_classes, len(ranked), dropped)
        ranked = ranked[:max_classes]
    return Head(name, CLASSIFICATION, vocabulary=sorted(ranked), label_dtype=kind, column=kept)


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
    try:
        exec(compile(source, path, "exec"), module.__dict__)
    except BaseException:
        del sys.modules[name]  # a half-run module must not be found by the next load in this process
        raise
    return module


def label_names(module: ModuleType | None, default_label: str) -> list[str]:
    labels = getattr(module, "LABELS", None)
    return [default_label] if labels is None else list(labels)  # [] is allowed: no heads (e.g. a GAN)


def module_for_data(module: ModuleType | None, label: str, columns, path: str | None) -> ModuleType | None:
    """A module applies only to data holding all its labels: one written for other data (the
    default penguins module on a user's CSV) gives way to the generic tabular model, with one
    warning, so `--set data.path=... --set data.label=...` is enough."""
    labels = getattr(module, "LABELS", None)
    if labels is None:
        return module
    missing = sorted(set(labels) - set(columns))
    if missing or (labels and label not in labels):
        reason = f"labels {missing} are not in the data" if missing else f"it does not predict data.label '{label}'"
        log.warning("trainer.module_file %s is for other data (%s): using the generic tabular model", path, reason)
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
    hook = module_code(hook)
    return lambda step, losses, model: hook(*(step, losses, model)[:count])


def module_code(fn):
    """A module's function run as a tf.function runs the code it calls: converted by autograph
    where it is traced (its Python `if` and `for` on tensors become graph control flow), as
    written where it runs eagerly (trainer.debug: breakpoints work). loopline's own step and
    evaluation are traced without autograph (they have no such control flow, and converting them
    cost about half a CPU second a run), so each module function they call is converted on its
    own. Wrap outside any trace: inside one traced without autograph, it would not be converted."""
    converted = tf.__internal__.autograph.tf_convert(fn, tf.__internal__.autograph.control_status_ctx())
    return lambda *args, **kwargs: (converted if tf.inside_function() else fn)(*args, **kwargs)


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


@keras.saving.register_keras_serializable(package="loopline")
class Preprocess(keras.layers.Layer):
    """The model module's `preprocess(features) -> features` as the model's first layer, so the
    SavedModel's signatures and the TFLite models run the same transform as training. It keeps
    the features' names and shapes. Saved by the module's path (its code is not serialized)."""

    def __init__(self, module_file: str, **kwargs):
        super().__init__(**kwargs)
        self.module_file = module_file
        self._preprocess = load_module(module_file).preprocess

    def call(self, features):
        out = self._preprocess(dict(features))
        if not isinstance(out, dict) or set(out) != set(features):
            raise ValueError(f"preprocess(features) in {self.module_file} must return a dict with the same keys "
                             f"{sorted(features)}")
        return out

    def get_config(self):
        return {**super().get_config(), "module_file": self.module_file}


def with_preprocess(module: ModuleType | None, ctx: ModelContext, model: keras.Model) -> keras.Model:
    """`model` behind the module's `preprocess` hook, when it has one."""
    if getattr(module, "preprocess", None) is None:
        return model
    inputs = ctx.inputs()
    outputs = model(Preprocess(module.__file__, name="preprocess")(inputs))
    return keras.Model(inputs, {name: keras.layers.Identity(name=name)(outputs[name]) for name in outputs},
                       name=model.name)


def build_model(module: ModuleType | None, ctx: ModelContext) -> keras.Model:
    builder = getattr(module, "build_model", None)
    model = with_preprocess(module, ctx, builder(ctx) if builder else build_tabular_model(ctx))
    missing = {h.name for h in ctx.heads} - set(model.output_names)
    if missing:
        raise ValueError(f"the model has no output for head(s) {sorted(missing)}; outputs are {model.output_names}")
    return model
