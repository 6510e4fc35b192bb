"""Hyperparameter search for loopline's own models (the `tuner:` section), and the clock that
bounds any KerasTuner search (a TFX module's `tuner_fn` too).

Each trial is a short loopline training with the trial's values over the trainer's keys
(`learning_rate`, `batch_size`, ...) and the model's `hparams.<key>`, scored on the validation
rows carved from the train split (the same salted hash as the Trainer's hold-out,
trainer/holdout.py): the eval split the Evaluator blesses on is never read. A KerasTuner oracle
(random search or Bayesian optimization) proposes the values; the best ones are what the Trainer
trains with.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from trainer.config import Section, TrainerConfig

log = logging.getLogger("loopline.tuner")

HPARAMS_PREFIX = "hparams."
DEFAULT_MAX_TRIALS = 10
# Trainer keys a search may set: the scalars of the step and the run (not paths, not sections).
SEARCHABLE = ("learning_rate", "batch_size", "epochs", "lr_schedule", "warmup_steps", "decay_rate", "cycle_steps",
              "min_learning_rate", "grad_accum_steps", "clip_norm", "ema_decay", "early_stopping_patience")


class Range(Section):
    """A number between min and max: an integer when min, max and step are whole numbers."""

    min: float = Field(description="The smallest value.")
    max: float = Field(description="The largest value.")
    step: float | None = Field(None, gt=0, description="Values min, min + step, ...; null: any value (a whole "
                               "number when min and max are).")
    sampling: Literal["linear", "log"] = Field("linear", description="How values are drawn: uniformly, or "
                                               "uniformly in their logarithm (learning rates).")

    @model_validator(mode="after")
    def _ordered(self):
        if self.min >= self.max:
            raise ValueError(f"min ({self.min}) must be below max ({self.max})")
        if self.sampling == "log" and self.min <= 0:
            raise ValueError("log sampling needs min > 0")
        return self

    def is_int(self) -> bool:
        return all(float(v).is_integer() for v in (self.min, self.max, self.step or 1))


class Choice(Section):
    values: list[int | float | str | bool] = Field(min_length=1, description="The values to choose from.")


class TunerConfig(Section):
    """The `tuner:` section: a Tuner step before the Trainer."""

    enabled: bool = Field(False, description="Search loopline's own model's hyperparameters (tuner.search_space) "
                          "before training; the Trainer trains with the best ones. A tuner.module_file turns the "
                          "step on by itself.")
    module_file: str | None = Field(None, description="A TFX module file with `tuner_fn(fn_args) -> TunerFnResult` "
                                    "(TFX's Tuner contract); its best hyperparameters reach the run_fn as "
                                    "`fn_args.hyperparameters`. null: loopline's search (when enabled).")
    max_trials: int | None = Field(None, ge=1, description=f"Trials at most; null: {DEFAULT_MAX_TRIALS} for "
                                   "loopline's search, the tuner_fn's own for a TFX module.")
    time_budget_seconds: float | None = Field(None, gt=0, description="No trial starts after this many seconds of "
                                              "search (logged); the one running finishes. null: no limit.")
    algorithm: Literal["random", "bayesian"] = Field("bayesian", description="loopline's search: KerasTuner's "
                                                     "random search or Bayesian optimization oracle.")
    objective: str = Field("auto", description="loopline's search: the validation metric to optimize (direction "
                           "from its name, as trainer.early_stopping_metric). auto: trainer.early_stopping_metric "
                           "when named, else <data.label>_loss.")
    trial_epochs: int | None = Field(None, ge=1, description="loopline's search: epochs per trial (early stopping "
                                     "may end one sooner); null: trainer.epochs.")
    seed: int = Field(0, description="Seeds Python, NumPy and TensorFlow before the search: the "
                      "oracle's proposals and a tuner_fn's models (TFX's own Tuner seeds nothing).")
    search_space: dict[str, Range | Choice] = Field(
        default_factory=dict, description="loopline's search: {key: {min, max, step, sampling: linear|log} or "
        "{values: [...]}}; a key is a trainer key (" + ", ".join(SEARCHABLE) + ") or hparams.<name> (the generic "
        "model's units, layers, l2, dropout; a module's build_model reads ctx.hparams).")

    @field_validator("search_space")
    @classmethod
    def _known_keys(cls, space: dict) -> dict:
        for key, entry in space.items():
            check_entry(key, entry)
        return space

    @model_validator(mode="after")
    def _space_when_enabled(self):
        if self.enabled and self.module_file is None and not self.search_space:
            raise ValueError("tuner.search_space is empty: name at least one key to search (e.g. "
                             "{learning_rate: {min: 0.0001, max: 0.01, sampling: log}})")
        return self

    @property
    def on(self) -> bool:
        return self.enabled or self.module_file is not None


def check_entry(key: str, entry: Range | Choice) -> None:
    """A key the trainer takes, with values its config accepts (each end of a range, each choice)."""
    if key.startswith(HPARAMS_PREFIX):
        if not key[len(HPARAMS_PREFIX):]:
            raise ValueError(f"tuner.search_space.{key}: name the hyperparameter after 'hparams.'")
        return
    if key not in SEARCHABLE:
        raise ValueError(f"tuner.search_space.{key}: not a key the search can set; use one of {', '.join(SEARCHABLE)} "
                         "or hparams.<name>")
    samples = [entry.min, entry.max] if isinstance(entry, Range) else entry.values
    if isinstance(entry, Range) and entry.is_int():
        samples = [int(v) for v in samples]
    for value in samples:
        try:
            TrainerConfig.model_validate({key: value})
        except ValidationError as exc:
            raise ValueError(f"tuner.search_space.{key}: {value!r} is not a valid trainer.{key} "
                             f"({exc.errors()[0]['msg']})") from None


def hyperparameters(space: dict[str, Range | Choice]):
    """The search space as keras_tuner.HyperParameters (named as the config keys)."""
    import keras_tuner

    hp = keras_tuner.HyperParameters()
    for key, entry in space.items():
        if isinstance(entry, Choice):
            hp.Choice(key, entry.values)
        elif entry.is_int():
            hp.Int(key, int(entry.min), int(entry.max), step=int(entry.step or 1), sampling=entry.sampling)
        else:
            hp.Float(key, entry.min, entry.max, step=entry.step, sampling=entry.sampling)
    return hp


def with_values(config: TrainerConfig, values: dict[str, Any]) -> TrainerConfig:
    """`config` with tuned values: trainer keys set, `hparams.<name>` into config.hparams."""
    raw = config.model_dump()
    for key, value in values.items():
        if key.startswith(HPARAMS_PREFIX):
            raw["hparams"] = {**raw["hparams"], key[len(HPARAMS_PREFIX):]: value}
        else:
            raw[key] = value
    return TrainerConfig.model_validate(raw)


def objective_name(tuner: TunerConfig, config: TrainerConfig, label: str) -> str:
    from serving.signature_names import signature_name

    if tuner.objective != "auto":
        return tuner.objective
    if config.early_stopping_metric not in (None, "auto"):
        return config.early_stopping_metric
    return f"{signature_name(label)}_loss"


def carve_validation(train_pattern: str, fraction: float, out_dir: str) -> tuple[str, str, int]:
    """The train split's records written as two GZIP files, the rows trained on and the validation
    rows (trainer/holdout.py's hash, so the Trainer holds out the same ones); returns their paths
    and the validation rows' count."""
    import tensorflow as tf

    from trainer.holdout import held_out

    if fraction <= 0:
        raise ValueError("tuner: trainer.validation_fraction is 0, so there are no validation rows to score "
                         "trials on (the eval split is the Evaluator's)")
    tf.io.gfile.makedirs(out_dir)
    paths = os.path.join(out_dir, "train.tfrecord.gz"), os.path.join(out_dir, "validation.tfrecord.gz")
    options = tf.io.TFRecordOptions(compression_type="GZIP")
    records = tf.data.TFRecordDataset(tf.io.gfile.glob(train_pattern), compression_type="GZIP").batch(4096)
    counts = [0, 0]
    with tf.io.TFRecordWriter(paths[0], options) as train, tf.io.TFRecordWriter(paths[1], options) as validation:
        for batch in records:
            mask = held_out(batch, fraction).numpy()
            for record, is_validation in zip(batch.numpy(), mask):
                (validation if is_validation else train).write(record)
                counts[int(is_validation)] += 1
    if not counts[0] or not counts[1]:
        raise ValueError(f"tuner: the train split's {sum(counts)} rows leave {counts[1]} validation rows and "
                         f"{counts[0]} to train on at trainer.validation_fraction={fraction}")
    log.info("tuner: trials train on %d rows and are scored on %d validation rows of the train split",
             counts[0], counts[1])
    return paths[0], paths[1], counts[1]


def _trial_tuner_class():
    """A KerasTuner BaseTuner whose trial is `trial_fn(values) -> {objective: value}` (imported
    late: KerasTuner is only needed when a search runs)."""
    from keras_tuner.engine import base_tuner

    class TrialFnTuner(base_tuner.BaseTuner):
        def __init__(self, oracle, trial_fn: Callable[[dict], dict], **kwargs):
            super().__init__(oracle, **kwargs)
            self.trial_fn = trial_fn

        def run_trial(self, trial, *args, **kwargs):
            return self.trial_fn(dict(trial.hyperparameters.values))

    return TrialFnTuner


def make_oracle(tuner: TunerConfig, objective: str):
    import keras_tuner

    from trainer.metric_direction import higher_is_better

    oracles = {"random": keras_tuner.oracles.RandomSearchOracle,
               "bayesian": keras_tuner.oracles.BayesianOptimizationOracle}
    return oracles[tuner.algorithm](
        objective=keras_tuner.Objective(objective, "max" if higher_is_better(objective) else "min"),
        max_trials=tuner.max_trials or DEFAULT_MAX_TRIALS, hyperparameters=hyperparameters(tuner.search_space),
        seed=tuner.seed, allow_new_entries=False, tune_new_entries=False)


def seed_search(seed: int) -> None:
    """KerasTuner reads an oracle's seed of None or 0 as "draw one from Python's random", and a
    tuner_fn's models draw their weights from TensorFlow's: seeded, a search is repeatable."""
    import keras

    keras.utils.set_random_seed(seed)


def search(config: TrainerConfig, tuner: TunerConfig, train_pattern: str, label: str, work_dir: str, **train_kwargs):
    """loopline's search: returns the searched KerasTuner tuner (its oracle holds the trials) and
    the TrialClock that timed them. `train_kwargs` go to trainer.loop.train (kinds, label_kind...)."""
    from trainer.loop import train

    seed_search(tuner.seed)
    objective = objective_name(tuner, config, label)
    train_file, validation_file, _ = carve_validation(train_pattern, config.validation_fraction,
                                                      os.path.join(work_dir, "rows"))
    # Trials: no hold-out of their own (the validation file is their eval split), no files.
    base = config.model_copy(update={"validation_fraction": 0.0, "tensorboard": False, "resume": False,
                                     "progress": "log", "epochs": tuner.trial_epochs or config.epochs})

    def trial(values: dict) -> dict:
        result = train(with_values(base, values), train_file, validation_file, label, **train_kwargs)
        if objective not in result.metrics:
            raise ValueError(f"tuner.objective: {objective!r} is not a metric of the model; it has "
                             f"{sorted(result.metrics)}")
        log.info("tuner: trial %s: %s %.4g", values, objective, result.metrics[objective])
        return {objective: float(result.metrics[objective])}

    searcher = _trial_tuner_class()(make_oracle(tuner, objective), trial, directory=work_dir,
                                    project_name="search", overwrite=True)
    clock = TrialClock(searcher, tuner.time_budget_seconds)
    searcher.search(verbose=0)  # KerasTuner's table on stdout; each trial has a log line here
    return searcher, clock


class TrialClock:
    """Times each trial of any KerasTuner tuner (a tuner_fn's too) and stops starting trials once
    `budget_s` seconds of search have passed (the running one finishes; one trial always runs)."""

    def __init__(self, searcher, budget_s: float | None):
        self.seconds: dict[str, float] = {}
        self.stopped_by_budget = False
        started, begun = time.monotonic(), {}
        on_begin, on_end, pre_create = searcher.on_trial_begin, searcher.on_trial_end, searcher.pre_create_trial

        def timed_begin(trial):
            begun[trial.trial_id] = time.monotonic()
            on_begin(trial)

        def timed_end(trial):
            on_end(trial)
            self.seconds[trial.trial_id] = round(time.monotonic() - begun.pop(trial.trial_id), 3)

        def within_budget():
            pre_create()
            oracle, spent = searcher.oracle, time.monotonic() - started
            if budget_s is not None and oracle.trials and spent >= budget_s and not self.stopped_by_budget:
                log.warning("tuner: time budget of %gs spent (%.0fs) after %d trial(s): no further trial starts "
                            "(tuner.time_budget_seconds)", budget_s, spent, len(oracle.trials))
                oracle.max_trials = len(oracle.trials)  # the oracle answers STOPPED from now on
                self.stopped_by_budget = True

        searcher.on_trial_begin, searcher.on_trial_end, searcher.pre_create_trial = timed_begin, timed_end, within_budget


def trial_records(searcher, seconds: dict[str, float]) -> list[dict]:
    """Each trial of a searched tuner: id, status, values, score and its metrics' best values."""
    records = []
    for trial_id, trial in sorted(searcher.oracle.trials.items()):
        metrics = {name: trial.metrics.get_best_value(name) for name in trial.metrics.metrics}
        records.append({"trial_id": trial_id, "status": str(trial.status), "values": dict(trial.hyperparameters.values),
                        "score": trial.score, "metrics": {k: float(v) for k, v in metrics.items() if v is not None},
                        "seconds": seconds.get(trial_id)})
    return records
