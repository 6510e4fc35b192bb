"""Building a training run: everything the steps and the controller use, in one object.

Like Orbit's trainer object: the strategy, the user's module, its models and optimizers, the
datasets and the checkpoints are made once here; `trainer.steps` compiles the steps from the
`Run`, and `trainer.loop` drives them.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Callable, Sequence

import keras
import tensorflow as tf

from serving.signature_names import signature_name, signature_names_of
from trainer import handover, holdout, linear_part, optimization
from trainer.checkpoints import Checkpoints
from trainer.config import TrainerConfig
from trainer.features import (FeatureKinds, FeatureStats, compute_stats, feature_shape, infer_feature_kinds, is_number,
                              is_scalar, kind_spec, resolve_image_shapes)
from trainer.flops import count_flops
from trainer.heads import CLASSIFICATION, Head
from trainer.inputs import (MARKED, column_batches, columns_dataset, count_picked, count_rows, eval_dataset,
                            handed_over_batches, handed_over_dataset, load_in_memory, make_dataset, parsed_batches,
                            split_marked, training_stream)
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
from trainer.selection import Selection, resolve_metric, resolve_patience
from trainer.speed import Speed, resolve_speed
from trainer.strategy import is_chief, make_strategy, task_name
from trainer.summaries import MetricSink

log = logging.getLogger("loopline.trainer")


@dataclass
class Run:
    """One training run, built by `build_run`."""

    config: TrainerConfig
    strategy: tf.distribute.Strategy
    chief: bool
    module: object  # the user's model module
    ctx: ModelContext
    all_kinds: FeatureKinds  # every column, labels included
    stats: FeatureStats
    heads: list[Head]
    steps_per_epoch: int
    total_steps: int
    speed: Speed
    models: dict[str, keras.Model]
    optimizers: dict[str, keras.optimizers.Optimizer]
    rng: tf.random.Generator
    model: keras.Model  # the live model that is exported
    export_model: keras.Model  # its float32 copy, holding the weights to export
    step_var: tf.Variable
    batches_var: tf.Variable  # batches consumed: where a resumed run's stream starts
    checkpoints: Checkpoints
    start_step: int
    iterator: object  # the distributed training stream
    stepped: keras.Model  # the model, or the part after the encoder when strings stay out of XLA
    jit: bool
    eval_data: tf.data.Dataset
    selection_data: tf.data.Dataset  # what the periodic evaluation reads: the validation rows, else eval_data
    read_probe_batch: Callable[[], tuple]  # reads `probe_batch`
    work_dir: str | None
    metric_sinks: Sequence[MetricSink]
    selection: Selection | None  # the best evaluation's metric and weights (None: the last weights are exported)
    patience: int | None  # early stopping's (None: never stops early)

    @property
    def kinds(self) -> FeatureKinds:
        """The model's inputs (labels removed)."""
        return self.ctx.kinds

    @property
    def custom_step(self) -> Callable | None:
        return getattr(self.module, "train_step", None)

    @cached_property
    def probe_batch(self) -> tuple:
        """A fixed training batch for gradient histograms (trainer.histogram_every_steps), read
        when first asked for: most runs draw no histograms."""
        return self.read_probe_batch()

    @cached_property
    def weights_fn(self) -> Callable | None:
        return loss_weights_hook(self.module)

    @property
    def optimizer(self) -> keras.optimizers.Optimizer | None:
        """The exported model's optimizer: its EMA weights are the ones exported."""
        return self.optimizers.get(export_name(self.module, self.models))

    @property
    def fused(self) -> bool:
        """On one replica without a train_step override, steps and their totals compile together."""
        return self.strategy.num_replicas_in_sync == 1 and self.custom_step is None


def refuse_keys_an_override_cannot_use(config: TrainerConfig) -> None:
    """At start-up: unroll_steps fuses the loop's own steps; a train_step override is not fused."""
    if config.unroll_steps != 1:
        raise ValueError(f"the module's train_step cannot be unrolled, so trainer.unroll_steps={config.unroll_steps} "
                         "cannot apply to it; leave it at 1")


def export_name(module, models: dict) -> str:
    return getattr(module, "EXPORT_MODEL", None) or next(iter(models))


def build_run(config: TrainerConfig, train_pattern: str, eval_pattern: str, label: str,
              metric_sinks: Sequence[MetricSink], work_dir: str | None, kinds: FeatureKinds | None,
              label_kind: str, max_classes: int | None, columns_dirs: Sequence[str] = ()) -> Run:
    strategy = make_strategy(config.strategy)
    chief = is_chief(strategy)
    data = _read_data(config, train_pattern, label, kinds, label_kind, max_classes, columns_dirs)
    steps_per_epoch, total_steps = _run_length(config, data["stats"])
    replicas = strategy.num_replicas_in_sync
    if config.batch_size % replicas:
        raise ValueError(f"trainer.batch_size={config.batch_size} must divide evenly across {replicas} replicas")
    on_cpu = replicas > 1 and any("CPU" in d.upper() for d in strategy.extended.worker_devices)
    module = data["module"]
    custom = getattr(module, "train_step", None) is not None
    models, optimizers, rng, export_model = _models_and_optimizers(config, strategy, module, data["ctx"], total_steps)
    model = models[export_name(module, models)]
    speed = resolve_speed(config, replicas, on_cpu, custom, steps_per_epoch, _cpu_dense_flops(config, strategy, model),
                          total_steps)
    selection = None
    if data["metric"] is not None:
        selection = Selection(data["metric"], export_model, holdout.VALIDATION if data["held_out"] else holdout.EVAL)
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
        **({"selection": selection} if selection is not None else {}),
    )
    start_step = checkpoints.start(config.resume, step_var)  # restores the variables above
    inputs = _datasets(config, module, strategy, model, data, train_pattern, eval_pattern,
                       int(batches_var.numpy()), speed.jit_compile, _reads(config, steps_per_epoch, total_steps),
                       columns_dirs)
    if config.unroll_steps > 1 and not (replicas == 1 and not custom):
        log.warning("trainer.unroll_steps=%d applies on one replica without a train_step override; running "
                    "one step per call", config.unroll_steps)
    return Run(config=config, strategy=strategy, chief=chief, module=module, ctx=data["ctx"],
               all_kinds=data["all_kinds"], stats=data["stats"], heads=data["heads"],
               steps_per_epoch=steps_per_epoch, total_steps=total_steps, speed=speed, models=models,
               optimizers=optimizers, rng=rng, model=model, export_model=export_model, step_var=step_var,
               batches_var=batches_var, checkpoints=checkpoints, start_step=start_step, **inputs,
               work_dir=work_dir, metric_sinks=metric_sinks, selection=selection, patience=data["patience"])


def _cpu_dense_flops(config: TrainerConfig, strategy: tf.distribute.Strategy, model: keras.Model) -> int | None:
    """One step's training FLOPs in the model's Dense layers on each replica, when they are CPUs
    (None on accelerators: XLA's matmuls there are the vendor's)."""
    if tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"):
        return None
    examples = config.batch_size * config.grad_accum_steps // strategy.num_replicas_in_sync
    return count_flops(model).training * examples


def _read_data(config, train_pattern, label, kinds, label_kind, max_classes, columns_dirs) -> dict:
    """What the data holds: feature kinds (from the schema when given), statistics, one head per
    label. `columns_dirs`: where the splits' columns may have been handed over (trainer.handover)."""
    all_kinds = resolve_image_shapes(dict(kinds), train_pattern) if kinds else infer_feature_kinds(train_pattern)
    signature_names_of(all_kinds)  # two columns with one name in the model: an error naming both
    module = module_for_data(load_module(config.module_file), label, all_kinds, config.module_file)
    if getattr(module, "train_step", None) is not None:
        refuse_keys_an_override_cannot_use(config)
    labels = label_names(module, label)
    for name in labels:
        if name not in all_kinds:
            raise ValueError(f"label column '{name}' is not in the data; columns are {sorted(all_kinds)}")
    metric, patience = _selection_settings(config, module, labels, label)
    fraction = config.validation_fraction if metric is not None else 0.0
    # The columns handed over with the split's records, where they are there: read instead of its
    # records, whether the split is held in memory or streamed.
    handed = handover.columns_file(columns_dirs, train_pattern, all_kinds, buckets=bool(fraction))
    # A split that fits in memory is parsed once (or taken from those columns): the hold-out's
    # count, the statistics, the training stream and the validation rows share it.
    columns, validation, held_out = _in_memory(config, train_pattern, all_kinds, fraction, handed)
    if held_out is None:  # not decided there (streamed: the held-out rows are counted in a pass of their own)
        held_out = _held_out_fraction(config, train_pattern, handed) if metric is not None else 0.0
    label_heads = head_kinds(labels, all_kinds, declared_head_kinds(module), label_kind)
    _check_categorical(config.categorical_features, all_kinds, labels)
    batches = _training_batches(train_pattern, all_kinds, columns, handed, held_out)
    stats = compute_stats(batches, all_kinds, classes=[name for name, kind in label_heads.items() if kind == CLASSIFICATION],
                          categorical=config.categorical_features)
    heads = [make_head(name, all_kinds[name], stats, label_heads[name], max_classes) for name in labels]
    inputs = {k: v for k, v in all_kinds.items() if k not in labels}
    ctx = ModelContext(inputs, stats, heads, hparams=dict(config.hparams))
    if config.linear_part and _generic(module):
        ctx.linear = _linear_part(ctx, columns)
    return {"all_kinds": all_kinds, "module": module, "columns": columns, "validation": validation, "stats": stats, "heads": heads,
            "ctx": ctx, "metric": metric, "patience": patience, "held_out": held_out,
            "handed": handed}


def _generic(module) -> bool:
    """The generic tabular model: no module, or one that builds no model."""
    return getattr(module, "build_model", None) is None and getattr(module, "build_models", None) is None


def _linear_part(ctx: ModelContext, columns) -> linear_part.LinearFit | None:
    """trainer.linear_part: fitted on the training rows held in memory; a streamed split has none."""
    if columns is None:
        log.info("generic model: no linear part (trainer.linear_part): the train split is streamed, not held in memory")
        return None
    return linear_part.fit(ctx.encoder().encoder, columns, ctx.heads)


def _check_categorical(names: list[str], kinds: FeatureKinds, labels: list[str]) -> None:
    """trainer.categorical_features must name number feature columns of one value or a list."""
    for name in names:
        if name not in kinds or name in labels:
            raise ValueError(f"trainer.categorical_features: '{name}' is not a feature column; features are "
                             f"{sorted(set(kinds) - set(labels))}")
        if not is_number(kinds[name]) or kind_spec(kinds[name]).is_image or len(feature_shape(kinds[name])) != 1:
            raise ValueError(f"trainer.categorical_features: '{name}' is {kinds[name]}; only number columns "
                             "(one value or a list) are read as categories (text columns already are)")


def _training_batches(train_pattern: str, all_kinds: FeatureKinds, columns, handed: str | None, held_out: float):
    """The training rows in batches, for their statistics: from the held columns, else from the
    handed-over ones (`handed`), else parsed from the records."""
    if columns is not None:
        return column_batches(columns)
    if handed is not None:
        log.info("training split streamed; its statistics, hold-out count and validation rows from the columns "
                 "handed over with its records")
        return handed_over_batches(handed, all_kinds,
                                   partial(holdout.training_buckets, fraction=held_out) if held_out else None)
    return parsed_batches(train_pattern, all_kinds, rows=partial(holdout.training_rows, fraction=held_out) if held_out else None)


def _selection_settings(config: TrainerConfig, module, labels: list[str], label: str) -> tuple[str | None, int | None]:
    """(the metric that selects the exported weights, early stopping's patience); the metric is
    None when nothing uses it (restore_best off and no early stopping)."""
    patience = resolve_patience(config.early_stopping_patience, config.early_stopping_metric, _generic(module))
    metric = resolve_metric(config.early_stopping_metric, [signature_name(name) for name in labels], label)
    return (metric if config.restore_best or patience is not None else None), patience


def _in_memory(config: TrainerConfig, train_pattern: str, all_kinds: FeatureKinds, fraction: float,
               handed: str | None):
    """(training columns, validation columns, fraction held out) when the train split is held in
    memory, its held-out rows sorted out in the same read; the columns None when it is streamed,
    the fraction None when nothing was to be held out or the split is streamed."""
    columns = load_in_memory(train_pattern, all_kinds, config.input, config.batch_size, held_out=fraction,
                             columns_file=handed)
    if columns is None or not fraction:
        return columns, None, None
    training, validation = split_marked(columns)
    held_out = _held_out(config, int(tf.shape(next(iter(validation.values())))[0]))
    if not held_out:
        return {k: v for k, v in columns.items() if k != MARKED}, None, 0.0
    if int(tf.shape(next(iter(training.values())))[0]) < config.batch_size:
        log.info("training split streamed from its records (fewer rows than one batch once %d are held out)",
                 int(tf.shape(next(iter(validation.values())))[0]))
        return None, None, held_out
    return training, validation, held_out


def _held_out_fraction(config: TrainerConfig, train_pattern: str, handed: str | None) -> float:
    """trainer.validation_fraction when it holds out enough rows (holdout.MIN_ROWS), else 0 (logged);
    counted from the handed-over columns' buckets where they are there (`handed`)."""
    fraction = config.validation_fraction
    if not fraction:
        return _held_out(config, 0)
    if handed is not None:
        return _held_out(config, count_picked(handed, partial(holdout.held_out_buckets, fraction=fraction)))
    return _held_out(config, count_rows(train_pattern, partial(holdout.validation_rows, fraction=fraction)))


def _held_out(config: TrainerConfig, held: int) -> float:
    """trainer.validation_fraction when `held` rows are enough (holdout.MIN_ROWS), else 0 (logged)."""
    fraction = config.validation_fraction
    if not holdout.enough(held, fraction):
        log.info("validation: %s; the eval split picks the weights to export and stops early",
                 f"trainer.validation_fraction={fraction:g} holds out {held} rows of the train split, under "
                 f"{holdout.MIN_ROWS}, so none are held out" if fraction else "trainer.validation_fraction is 0")
        return 0.0
    log.info("validation: %d rows of the train split held out (trainer.validation_fraction=%g), not trained on",
             held, fraction)
    return fraction


def _run_length(config: TrainerConfig, stats: FeatureStats) -> tuple[int, int]:
    """An epoch is one pass of full batches; a step takes grad_accum_steps batches."""
    batches_per_epoch = max(stats.count // config.batch_size, 1)  # stats.count: rows in the train split
    steps_per_epoch = max(batches_per_epoch // config.grad_accum_steps, 1)
    total_steps = config.epochs * steps_per_epoch
    if config.max_steps:
        total_steps = min(total_steps, config.max_steps)
    return steps_per_epoch, total_steps


def _models_and_optimizers(config, strategy, module, ctx, total_steps):
    """Models and optimizers under the strategy and precision policy; an export copy in float32."""
    schedule = optimization.learning_rate_schedule(config, total_steps)
    keras.config.set_dtype_policy(config.precision)
    with strategy.scope():
        models = build_models(module, ctx)
        if getattr(module, "train_step", None) is not None:
            ctx.learning_rates = optimization.optimizer_schedules(config, list(models), total_steps)
            optimizers = _module_optimizers(module, ctx, schedule, models, config)
        else:
            optimizers = {"model": optimization.make_optimizer(config, schedule, models["model"].trainable_variables)}
        rng = tf.random.Generator.from_seed(config.seed)
    keras.config.set_dtype_policy("float32")
    export_model = build_models(module, ctx)[export_name(module, models)]
    return models, optimizers, rng, export_model


def _module_optimizers(module, ctx, schedule, models, config) -> dict:
    """A train_step module's optimizers (ctx.learning_rates set), with the config's per-optimizer controls: lr_multipliers
    and float16 loss scaling on each, EMA on the exported model's (under the strategy scope)."""
    optimizers = module.build_optimizers(ctx, schedule)
    exported = export_name(module, models)
    return {name: optimization.prepare(opt, config, models[name].trainable_variables if name in models else [],
                                       ema=name == exported) for name, opt in optimizers.items()}


def _reads(config: TrainerConfig, steps_per_epoch: int, total_steps: int) -> dict[str, int]:
    """How often each split is read: the training records (passes), the selection split
    (evaluations: every eval_every_steps, and at the end)."""
    eval_every = config.eval_every_steps or steps_per_epoch
    return {"train": -(-total_steps // steps_per_epoch), "evaluations": -(-total_steps // eval_every)}


def _cached(input_config, reads: int):
    """The input settings for records read `reads` times: caching what is read once only costs memory."""
    return input_config if reads > 1 else input_config.model_copy(update={"cache": False})


EVALUATION_ROWS = 8192  # rows per evaluation call when every column holds one value


def _evaluation_batch(config: TrainerConfig, all_kinds: FeatureKinds) -> int:
    """Rows per evaluation call: an evaluation keeps no activations for gradients, so with one
    value per column (a table) it takes EVALUATION_ROWS at once, the same sums in a few dozen
    calls instead of thousands; other inputs (images, lists) keep the training batch size."""
    return max(config.batch_size, EVALUATION_ROWS) if all(is_scalar(kind) for kind in all_kinds.values()) else config.batch_size


def _datasets(config, module, strategy, model, data, train_pattern, eval_pattern, skip_batches, jit, reads,
              columns_dirs) -> dict:
    """The distributed training stream (resuming after `skip_batches`), the eval split (from its
    columns where they are handed over in `columns_dirs`), the validation rows (the eval split
    when none are held out) and a probe batch."""
    all_kinds, heads, held_out = data["all_kinds"], data["heads"], data["held_out"]
    dataset = training_stream(train_pattern, all_kinds, heads, config.batch_size, _cached(config.input, reads["train"]),
                              config.seed, skip_batches=skip_batches, columns=data["columns"],
                              augment=getattr(module, "augment", None),
                              rows=partial(holdout.training_rows, fraction=held_out) if held_out else None)
    custom = getattr(module, "train_step", None) is not None
    stepped, dataset, jit_on = _compile_strings_out(model, data["ctx"].kinds, dataset, config, jit and not custom)
    evaluated, batch = _cached(config.input, reads["evaluations"]), _evaluation_batch(config, all_kinds)
    # With rows held out, the eval split is read once, by the final evaluation.
    eval_data = eval_dataset(eval_pattern, all_kinds, heads, batch, _cached(config.input, 1) if held_out else evaluated,
                             columns_dirs)
    if not held_out:
        selection_data = eval_data
    elif data["validation"] is not None:  # held in memory with the training rows
        selection_data = columns_dataset(data["validation"], heads, batch, config.input)
    elif data["handed"] is not None:  # streamed: the validation rows of the handed-over columns
        selection_data = handed_over_dataset(data["handed"], all_kinds, heads, batch, evaluated,
                                             pick=partial(holdout.held_out_buckets, fraction=held_out))
    else:
        selection_data = make_dataset(train_pattern, all_kinds, heads, batch, evaluated,
                                      rows=partial(holdout.validation_rows, fraction=held_out))
    return {"iterator": iter(strategy.experimental_distribute_dataset(dataset)), "stepped": stepped,
            "jit": jit_on or (jit and custom), "eval_data": eval_data, "selection_data": selection_data,
            "read_probe_batch": lambda: next(iter(make_dataset(train_pattern, all_kinds, heads, config.batch_size,
                                                                config.input)))}


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
    encode = tf.autograph.experimental.do_not_convert(lambda features, targets: (encoder(features), targets))
    dataset = dataset.map(encode,
                          num_parallel_calls=tf.data.AUTOTUNE, deterministic=config.input.deterministic)
    return stepped, dataset, jit
