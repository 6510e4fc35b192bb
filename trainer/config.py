"""The trainer's configuration: the `trainer:` section of loopline.yaml."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trainer.metric_direction import HIGHER_IS_BETTER_TEXT

AUTO_STEPS_PER_LOOP = 32  # what steps_per_loop "auto" runs per call (or the epoch, if shorter)


class Section(BaseModel):
    """A section of loopline.yaml: unknown keys are refused, assignments validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class InputConfig(Section):
    """tf.data over the GZIP TFRecord splits."""

    in_memory_mb: int = Field(
        512, ge=0, description="A training split whose parsed columns fit in this many MB is parsed once and held in "
        "memory; each epoch is then a full shuffle of its rows. 0: always stream the records.",
    )
    shuffle_buffer: int = Field(
        10_000, ge=1, description="Streamed records: the window of records permuted together and parsed in one call "
        "(the windows' order is shuffled 4 at a time).",
    )
    cache: bool = Field(True, description="Cache the serialized records in memory after the first pass (streamed records).")
    parallel_reads: int = Field(4, ge=1, description="Files read at once (parallel interleave).")
    deterministic: bool = Field(
        True, description="Same order on every run (and exact resume); false lets tf.data reorder for speed."
    )


Schedule = Literal["constant", "cosine", "exponential", "triangular"]


class OptimizerSettings(Section):
    """`trainer.optimizers.<name>`: learning-rate keys for one of a module's optimizers (keyed like
    the models they train); a key left out takes the trainer-level value."""

    learning_rate: float | None = Field(None, gt=0, description="This optimizer's peak learning rate; null: "
                                        "trainer.learning_rate.")
    lr_schedule: Schedule | None = Field(None, description="This optimizer's schedule; null: trainer.lr_schedule.")
    warmup_steps: int | None = Field(None, ge=0, description="null: trainer.warmup_steps.")
    decay_steps: int | None = Field(None, ge=1, description="null: trainer.decay_steps.")
    decay_rate: float | None = Field(None, gt=0, le=1, description="null: trainer.decay_rate.")
    cycle_steps: int | None = Field(None, ge=2, description="null: trainer.cycle_steps.")
    min_learning_rate: float | None = Field(None, ge=0, description="null: trainer.min_learning_rate.")


class TrainerConfig(Section):
    """Every key is optional; the defaults train the bundled data as they are."""

    module_file: str | None = Field(
        None, description="User model module (build_model, heads...), or a TFX module file with `run_fn(fn_args)` "
        "(TFX's Trainer contract, called with a real FnArgs); null builds a generic tabular model."
    )
    train_steps: int | None = Field(
        None, ge=1, description="A TFX module's run_fn: `fn_args.train_steps` (TFX's TrainArgs.num_steps); null: None.")
    eval_steps: int | None = Field(
        None, ge=1, description="A TFX module's run_fn: `fn_args.eval_steps` (TFX's EvalArgs.num_steps); null: None.")
    custom_config: dict[str, Any] = Field(
        default_factory=dict, description="A TFX module's run_fn: `fn_args.custom_config` (TFX's Trainer custom_config).")
    epochs: int = Field(20, ge=1, description="Passes over the training split (fewer when max_steps or early "
                        "stopping ends the run first).")
    max_steps: int | None = Field(None, ge=1, description="Stop after this many optimizer steps.")
    batch_size: int = Field(32, ge=1, description="Global batch size (split across replicas).")
    learning_rate: float = Field(0.01, gt=0, description="The peak learning rate of the schedule (Adam's unless the "
                                 "module builds its own optimizers).")
    seed: int = Field(42, description="Seeds Python, NumPy and TensorFlow (initial weights, shuffling) and the "
                      "augmentations' random streams (bit-identical reruns on CPU need deterministic too); set "
                      "before a TFX module's run_fn is called.")
    input: InputConfig = Field(InputConfig(), description="tf.data over the GZIP TFRecord splits.")

    # Distribution and speed.
    strategy: Literal["auto", "one_device", "mirrored", "multi_worker"] = Field(
        "auto", description="auto: multi_worker when TF_CONFIG names a cluster, mirrored on 2+ GPUs, else one device."
    )
    precision: Literal["float32", "mixed_float16", "mixed_bfloat16"] = Field(
        "float32", description="Keras mixed precision policy; mixed_float16 adds dynamic loss scaling "
        "(LossScaleOptimizer), mixed_bfloat16 needs none. Variables and the exported model stay float32.")
    jit_compile: bool | Literal["auto"] = Field(
        "auto", description="Compile the step with XLA. auto: on with one replica, no debug and no train_step "
        "override, except on CPU for a step of 1 GFLOP or more in Dense layers or a run of fewer than 6,000 steps "
        "(logged when off); true where it cannot apply is refused.",
    )
    steps_per_loop: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto", description="Optimizer steps run inside one tf.function call. auto: 32 (or the epoch, if shorter); "
        "1 under debug.",
    )
    unroll_steps: int = Field(
        1, ge=1, description="Optimizer steps unrolled into one compiled call (one replica, no train_step override): "
        "fewer XLA launches per step, longer compilation.",
    )

    # The step.
    lr_schedule: Schedule = Field(
        "constant", description="constant, cosine (with warm-up), exponential, or triangular (cyclical: from "
        "min_learning_rate up to learning_rate and back every cycle_steps).",
    )
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps (cosine schedule).")
    decay_steps: int | None = Field(
        None, ge=1, description="cosine: steps to decay over (default: the whole run); exponential: steps per decay_rate."
    )
    decay_rate: float = Field(0.96, gt=0, le=1, description="exponential: factor per decay_steps.")
    cycle_steps: int = Field(200, ge=2, description="triangular: steps per cycle (up and back down).")
    min_learning_rate: float = Field(0.0, ge=0, description="triangular: the rate at each cycle's ends.")
    optimizers: dict[str, OptimizerSettings] = Field(
        default_factory=dict, description="Per-optimizer learning-rate keys of a module with build_optimizers "
        "({name: {learning_rate, lr_schedule, warmup_steps, decay_steps, decay_rate, cycle_steps, min_learning_rate}}).",
    )
    grad_accum_steps: int = Field(1, ge=1, description="Batches whose gradients are summed per optimizer step.")
    clip_norm: float | None = Field(None, gt=0, description="Clip gradients by this global norm.")
    ema_decay: float | None = Field(
        None, gt=0, lt=1, description="Keep an exponential moving average of the weights; eval and export use it."
    )
    nan_policy: Literal["stop", "skip"] = Field(
        "stop", description="A non-finite loss or gradient: stop with an error naming the step, or skip the update."
    )
    lr_multipliers: dict[str, float] = Field(
        default_factory=dict,
        description="Per-layer learning-rate multipliers: {regex on variable path: factor}; first match wins.",
    )

    categorical_features: list[str] = Field(
        default_factory=list, description="Number columns whose values are categories (codes, ids, a class number): "
        "the generic encoder one-hot encodes them (an embedding over 30 values) as it does text, instead of "
        "standardizing them. Whole numbers only; a value the train split lacks encodes as unseen. A Transform's "
        "outputs that its schema marks categorical (tft vocabularies, buckets, hashes) are added.",
    )
    linear_part: bool = Field(
        True, description="The generic tabular model only: a linear model on its encoded features (and the log of "
        "skewed positive numbers, and text columns of many values one-hot), fitted exactly on the trained rows before the loop (scikit-learn's "
        "LogisticRegression or Ridge, C=0.1, on at most 200,000 rows and 20 million encoded values) and frozen; the network adds to its "
        "logits from an output layer that starts at zero. Needs the train split held in memory "
        "(trainer.input.in_memory_mb); false: the network alone.",
    )
    hparams: dict[str, Any] = Field(
        default_factory=dict, description="Model hyperparameters, given to a module's build_model as ctx.hparams; "
        "the generic tabular model reads units (64), layers (2), l2 (0.001) and dropout (0.0). A Tuner step's best "
        "values for hparams.<key> land here.",
    )

    # Checkpoints, evaluation, summaries.
    checkpoint_every_steps: int | None = Field(None, ge=1, description="Default: at the end of every epoch.")
    keep_checkpoints: int = Field(3, ge=1, description="Checkpoints kept in `<work_dir>/checkpoints` (the newest N).")
    resume: bool = Field(
        True, description="Resume from the latest checkpoint in the work folder; false moves old checkpoints aside "
        "(to checkpoints-set-aside-<time>, logged) and starts at step 0.",
    )
    eval_every_steps: int | None = Field(None, ge=1, description="Default: at the end of every epoch.")
    validation_fraction: float = Field(
        0.2, ge=0, lt=1, description="Share of the train split's rows held out (by a salted hash of each record, "
        "independent of ExampleGen's split) to pick the weights to export and to stop early; they are not trained "
        "on. Under 50 such rows, or 0: nothing is held out and the eval split is used instead (logged).",
    )
    early_stopping_metric: str | None = Field(
        "auto", description="The validation metric that picks the weights to export (restore_best) and that early "
        "stopping watches, e.g. species_loss or species_accuracy (higher is better for a name with a word "
        f"{HIGHER_IS_BETTER_TEXT}, lower for others). "
        "auto: <data.label>_loss (none for a model without heads); null: neither.",
    )
    early_stopping_patience: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        "auto", description="Evaluations without improvement before training stops. auto: 10 for the generic "
        "tabular model and for any model whose early_stopping_metric is named; a model module on the auto metric "
        "trains every epoch. null: never stop early.",
    )
    restore_best: bool = Field(
        True, description="Export the weights of the best evaluation of early_stopping_metric (the EMA weights "
        "when ema_decay is set); false: the last weights.",
    )
    tensorboard: bool = Field(True, description="Write TensorBoard summaries under the work folder.")
    histogram_every_steps: int = Field(0, ge=0, description="Weight/gradient histograms and per-layer grad norms; 0: off.")
    progress: Literal["auto", "bar", "log"] = Field("auto", description="auto: a bar on a terminal, log lines otherwise.")

    # Reproducibility and debugging.
    deterministic: bool = Field(False, description="TF op determinism (bit-identical reruns on CPU; slower).")
    debug: bool = Field(False, description="Run the step eagerly with numeric checks (breakpoints and prints work).")
