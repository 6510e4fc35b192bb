"""Tuner: a hyperparameter search before the Trainer, writing TFX's Tuner artifacts. TFX's own
component needs TensorFlow Data Validation (through its Trainer's imports), which does not install
here; this one keeps its contract. A TFX module file's `tuner_fn(fn_args)` gets the FnArgs TFX's
Tuner gives and returns a TunerFnResult, whose `tuner.search(**fit_kwargs)` runs here; without one,
loopline's own search (trainer/tuning.py) tunes loopline's model. Either way the outputs are TFX's:
`best_hyperparameters` (HyperParameters: `best_hyperparameters.txt`, the JSON of
`keras_tuner.HyperParameters.get_config()`, what TFX's Trainer reads into `fn_args.hyperparameters`)
and `tuner_results` (TunerResults: `tuner_results.json`, the completed trials best first)."""

import json
import logging
import os

from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component
from tfx.types.standard_artifacts import Examples, HyperParameters, Schema, TransformGraph, TunerResults

from components.splits import TRAIN_SPLIT, split_pattern

SEARCH_RUN = "mlflow_run_id"  # HyperParameters artifact property: the search's MLflow run (the Trainer nests it)


@component
def Tuner(
    examples: InputArtifact[Examples],
    best_hyperparameters: OutputArtifact[HyperParameters],
    tuner_results: OutputArtifact[TunerResults],
    tuner_config: Parameter[str],
    trainer_config: Parameter[str],
    label: Parameter[str],
    label_kind: Parameter[str] = "auto",
    max_classes: Parameter[int] = 0,
    module_sha256: Parameter[str] = "",
    schema: InputArtifact[Schema] = None,
    tracking: Parameter[str] = "",
    transform_graph: InputArtifact[TransformGraph] = None,
    transformed_examples: InputArtifact[Examples] = None,
) -> None:
    """`tuner_config` and `trainer_config`: the `tuner:` and `trainer:` sections as JSON (the search
    space and the settings trials start from are in the cache key through them); `module_sha256`:
    the tuner's and trainer's module files' digests, so an edit to either is a new search."""
    del module_sha256  # Only there for the cache key.
    from tfx.components.tuner.executor import write_best_hyperparameters

    from trainer.config import TrainerConfig
    from trainer.tuning import TunerConfig, trial_records

    logging.getLogger("loopline").setLevel(logging.INFO)
    tuner = TunerConfig.model_validate_json(tuner_config)
    config = TrainerConfig.model_validate_json(trainer_config)
    work_dir = os.path.join(tuner_results.uri, "work")  # KerasTuner's files; removed at the end
    if tuner.module_file:
        searcher, clock = _tuner_fn_search(tuner, config, transformed_examples or examples, schema,
                                           transform_graph, work_dir)
    else:
        searcher, clock = _loopline_search(tuner, config, examples, schema, label, label_kind, max_classes, work_dir,
                                           transform_graph, transformed_examples)
    _check_completed(searcher)
    write_best_hyperparameters(searcher, {"best_hyperparameters": [best_hyperparameters],
                                          "tuner_results": [tuner_results]})
    tf_rmtree(work_dir)
    trials = trial_records(searcher, clock.seconds)
    best = searcher.get_best_hyperparameters(1)[0].values
    _record(best_hyperparameters, tuner, trials, best, clock, tracking)


def _tuner_fn_search(tuner, config, examples, schema, transform_graph, work_dir):
    """TFX's Tuner contract: tuner_fn(fn_args) -> TunerFnResult; tuner.max_trials overrides the
    tuner_fn's own, tuner.time_budget_seconds bounds the search."""
    from components.tfx_fn_args import common_fn_args
    from components.tfx_module_file import keras_tuner_on_module_keras, module_function, printed_to_log
    from trainer.tuning import TrialClock, seed_search

    tuner_fn = module_function(tuner.module_file, "tuner_fn")
    seed_search(tuner.seed)
    with keras_tuner_on_module_keras():
        result = tuner_fn(common_fn_args(examples, schema, transform_graph, config, working_dir=work_dir))
        searcher = result.tuner
        if tuner.max_trials:
            searcher.oracle.max_trials = tuner.max_trials
        clock = TrialClock(searcher, tuner.time_budget_seconds)
        logging.getLogger("loopline").info("tuner: %s's tuner_fn: up to %s trials",
                                           os.path.basename(tuner.module_file), searcher.oracle.max_trials)
        with printed_to_log(logging.getLogger("loopline.tuner")):
            searcher.search(**result.fit_kwargs)
    return searcher, clock


def _loopline_search(tuner, config, examples, schema, label, label_kind, max_classes, work_dir,
                     transform_graph=None, transformed_examples=None):
    """On the examples and features the Trainer trains on: the Transform's, when there is one."""
    from components.transform import training_inputs
    from trainer.tuning import search

    examples, kinds, _, config = training_inputs(examples, schema, transform_graph, transformed_examples, config, label)
    return search(config, tuner, split_pattern(examples, TRAIN_SPLIT), label, work_dir, kinds=kinds,
                  label_kind=label_kind, max_classes=max_classes or None)


def _check_completed(searcher) -> None:
    """A search whose every trial failed stops the run with the first failure's last line."""
    trials = list(searcher.oracle.trials.values())
    if any(t.status == "COMPLETED" for t in trials):
        return
    messages = [(getattr(t, "message", None) or "").strip().splitlines() for t in trials]
    first = next((lines[-1] for lines in messages if lines), "see the log above")
    raise RuntimeError(f"tuner: none of {len(trials)} trial(s) completed; the first failed with: {first}")


def tf_rmtree(path: str) -> None:
    import tensorflow as tf

    if tf.io.gfile.exists(path):
        tf.io.gfile.rmtree(path)


def _record(best_hyperparameters, tuner, trials: list[dict], best: dict, clock, tracking: str) -> None:
    """The log line, the artifact's properties (trials, seconds) and the MLflow runs."""
    from tracking.tuning_runs import log_search

    seconds = [t["seconds"] for t in trials if t["seconds"] is not None]
    logging.getLogger("loopline").info(
        "tuner: %d trial(s) in %.1fs%s; best %s", len(trials), sum(seconds),
        " (stopped by tuner.time_budget_seconds)" if clock.stopped_by_budget else "", best)
    best_hyperparameters.set_int_custom_property("trials", len(trials))
    best_hyperparameters.set_float_custom_property("search_seconds", float(sum(seconds)))
    best_hyperparameters.set_string_custom_property("best_values", json.dumps(best, sort_keys=True))
    params = {"max_trials": tuner.max_trials, "time_budget_seconds": tuner.time_budget_seconds,
              "algorithm": "tuner_fn" if tuner.module_file else tuner.algorithm,
              "stopped_by_budget": clock.stopped_by_budget}
    run_id = log_search(tracking, trials, params, best, {"loopline.component": "Tuner"})
    best_hyperparameters.set_string_custom_property(SEARCH_RUN, run_id)
