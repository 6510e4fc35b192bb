"""The pipeline's Trainer: runs trainer/ on ExampleGen's splits and exports the SavedModel
where the standard Pusher looks for it (`<model uri>/Format-Serving`). A TFX module file (with
`run_fn`) is called instead, as TFX's Trainer calls it: a real FnArgs, the Transform's examples
and graph when there is a Transform step, and its `serving_model_dir` is the Model artifact's."""

import json
import logging
import os

from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component
from tfx.types.standard_artifacts import Examples, HyperParameters, Model, ModelRun, Schema, TransformGraph
from tfx.utils import path_utils

from components.splits import EVAL_SPLIT, TRAIN_SPLIT, columns_dir, split_pattern

TFLITE_DROPPED = "tflite_dropped"  # Model artifact property: {variant: why} of dropped TFLite variants
SESSION_PROBLEM = "session_problem"  # Model artifact property: why a run_fn's SavedModel fails in a TF1 Session
EXPORTED = "exported"  # Model artifact property: the weights exported (trainer's TrainResult.exported), as JSON


@component
def Trainer(
    examples: InputArtifact[Examples],
    model: OutputArtifact[Model],
    model_run: OutputArtifact[ModelRun],
    trainer_config: Parameter[str],
    label: Parameter[str],
    label_kind: Parameter[str] = "auto",
    max_classes: Parameter[int] = 0,
    module_sha256: Parameter[str] = "",
    export_config: Parameter[str] = "{}",
    schema: InputArtifact[Schema] = None,
    tracking: Parameter[str] = "",
    transform_graph: InputArtifact[TransformGraph] = None,
    transformed_examples: InputArtifact[Examples] = None,
    hyperparameters: InputArtifact[HyperParameters] = None,
) -> None:
    """`trainer_config` is the `trainer:` section as JSON; `module_sha256` makes the cache see
    edits to the user's module file; `export_config` is the `export:` section as JSON;
    `tracking` is a tracking.target.TrackingTarget as JSON (empty: no MLflow); `label_kind` and
    `max_classes` are data.label_kind and data.max_classes (0: no cap); `transform_graph` and
    `transformed_examples`: the Transform step's, given to a TFX module's run_fn; `hyperparameters`:
    the Tuner step's best, a run_fn's `fn_args.hyperparameters`, else set over `trainer_config`."""
    del module_sha256  # Only there for the cache key.
    from trainer.config import TrainerConfig
    from trainer.export import dropped_variants, export_model
    from trainer.export_config import ExportConfig
    from trainer.loop import train
    from trainer.tfx_contract import defines_run_fn

    logging.getLogger("loopline").setLevel(logging.INFO)
    config = TrainerConfig.model_validate_json(trainer_config)
    if defines_run_fn(config.module_file):
        _call_run_fn(config, transformed_examples or examples, schema, transform_graph, model, model_run, tracking,
                     hyperparameters, examples, ExportConfig.model_validate_json(export_config))
        return
    tuned = _tuned_values(hyperparameters)
    if tuned:
        from trainer.tuning import with_values

        config = with_values(config, tuned)
    from components.transform import training_inputs

    # The parsing spec comes from the schema, not from sampling the data; behind a Transform, the
    # model trains on its examples, its graph in the signatures.
    train_on, kinds, transform, config = training_inputs(examples, schema, transform_graph, transformed_examples,
                                                         config, label)
    from tracking.training_run import TAG_MODEL_URI, start_training_run

    run = start_training_run(tracking, {TAG_MODEL_URI: model.uri}, spill_dir=model_run.uri)
    try:
        result = train(config, split_pattern(train_on, TRAIN_SPLIT), split_pattern(train_on, EVAL_SPLIT), label,
                       metric_sinks=[run.sink] if run else [], kinds=kinds, work_dir=model_run.uri,
                       label_kind=label_kind, max_classes=max_classes or None,
                       columns_dirs=[columns_dir(train_on.uri, split) for split in (TRAIN_SPLIT, EVAL_SPLIT)])
        # Float32 SavedModel (+ warmup), TFLite variants behind the parity gate, export_report.*,
        # checked on the raw examples the signatures take.
        report = export_model(result.model, result.kinds, result.heads, result.metrics,
                     path_utils.serving_model_path(model.uri), model.uri,
                     split_pattern(examples, TRAIN_SPLIT), split_pattern(examples, EVAL_SPLIT),
                     ExportConfig.model_validate_json(export_config), default=label, exported=result.exported,
                     transform=transform)
    except BaseException:
        if run:
            run.finish({}, failed=True)
        raise
    _record(model, model_run, {**result.metrics, "steps": result.steps}, dropped_variants(report), run, result.exported,
            tuned=tuned, hyperparameters=hyperparameters, tracking=tracking)


def _tuned_values(hyperparameters) -> dict:
    """The Tuner's best values ({} without a Tuner step), logged: the Trainer trains with them."""
    if hyperparameters is None:
        return {}
    from components.tfx_fn_args import read_best_hyperparameters

    values = read_best_hyperparameters(hyperparameters.uri).get("values", {})
    logging.getLogger("loopline").info("trainer: the Tuner's best hyperparameters: %s", values)
    return values


def _call_run_fn(config, examples, schema, transform_graph, model, model_run, tracking: str, hyperparameters,
                 raw_examples, export) -> None:
    """TFX's Trainer contract: the module's run_fn trains and writes `fn_args.serving_model_dir`.
    The custom loop's controls and warmup do not apply to it; its TFLite variants are checked on
    `raw_examples` (its serving signature takes raw tf.Examples) under `export` (the export:
    section; trainer.foreign_export). What a `fit()` wrote through its TensorBoard callback into
    `model_run_dir` goes to MLflow: each epoch's metrics, and the logs themselves."""
    import keras
    import tensorflow as tf

    from components.tfx_fn_args import trainer_fn_args
    from components.tfx_module_file import module_function, printed_to_log, tfx_keras
    from serving.signature_names import DEFAULT
    from tracking.training_run import TAG_MODEL_URI, start_training_run
    from trainer.export import dropped_variants
    from trainer.fit_logs import final_eval_metrics, fit_history, optimizer_steps
    from trainer.foreign_export import export_foreign
    from trainer.session_check import session_problem

    run_fn = module_function(config.module_file, "run_fn")
    fn_args = trainer_fn_args(examples, schema, transform_graph, model, model_run, config, hyperparameters)
    run = start_training_run(tracking, {TAG_MODEL_URI: model.uri}, spill_dir=model_run.uri)
    try:  # whatever stops the Trainer from here marks its MLflow run failed
        # TFX seeds nothing; seeded, the same data, module and keys train the same model.
        keras.utils.set_random_seed(config.seed)
        with tfx_keras(), printed_to_log(logging.getLogger("loopline.trainer")):
            run_fn(fn_args)
        if not tf.saved_model.contains_saved_model(fn_args.serving_model_dir):
            raise ValueError(f"{config.module_file}: run_fn wrote no SavedModel to fn_args.serving_model_dir "
                             f"({fn_args.serving_model_dir})")
        logging.getLogger("loopline").info("trainer: %s's run_fn wrote %s", os.path.basename(config.module_file),
                                           fn_args.serving_model_dir)
        problem = session_problem(fn_args.serving_model_dir)
        if problem:  # pushed all the same: a server with a TF2 loader may serve it
            logging.getLogger("loopline").warning(
                "trainer: %s does not run in a TensorFlow 1 Session, how TF Serving and loopline serve call a model: "
                "%s", fn_args.serving_model_dir, problem)
            model.set_string_custom_property(SESSION_PROBLEM, problem)
        history = fit_history(model_run.uri)
        if run:
            for epoch, metrics in sorted(history.items()):
                run.sink.log(epoch, metrics)
        steps = optimizer_steps(model_run.uri)
        metrics = {**final_eval_metrics(history), **({"steps": steps} if steps else {})}
        report = export_foreign(fn_args.serving_model_dir, model.uri, DEFAULT, split_pattern(raw_examples, TRAIN_SPLIT),
                                split_pattern(raw_examples, EVAL_SPLIT), metrics, export)
    except BaseException:
        if run:
            run.finish({}, failed=True)
        raise
    _record(model, model_run, metrics, dropped_variants(report), run, {},
            tuned=(fn_args.hyperparameters or {}).get("values", {}), hyperparameters=hyperparameters, tracking=tracking)


def _record(model, model_run, metrics: dict, dropped: dict, run, exported: dict, tuned: dict | None = None,
            hyperparameters=None, tracking: str = "") -> None:
    """metrics.json, the Model artifact's properties the run summary and Registrar read, and the
    MLflow run finished (the Registrar continues it) with the tuned values as parameters
    (`tuned.<key>`) and the Tuner's search run nested under it."""
    import tensorflow as tf

    from trainer.export import exported_weights
    from tracking.training_run import EXPORTED_TAG, TFLITE_DROPPED_TAG

    tf.io.gfile.makedirs(model_run.uri)  # Kubeflow's launcher does not create output folders
    with tf.io.gfile.GFile(os.path.join(model_run.uri, "metrics.json"), "w") as f:
        f.write(json.dumps(metrics, indent=2))
    for key, value in metrics.items():
        model.set_float_custom_property(f"eval_{key}", float(value))
    if dropped:  # read by the run summary; the MLflow run gets it as a tag
        model.set_string_custom_property(TFLITE_DROPPED, json.dumps(dropped))
    model.set_string_custom_property(EXPORTED, json.dumps(exported))  # read by the run summary
    if run:
        tags = {EXPORTED_TAG: exported_weights(exported)} if exported else {}  # none from a run_fn
        if dropped:
            tags[TFLITE_DROPPED_TAG] = json.dumps(dropped)
        delivery = run.finish({"trainer": model_run.uri}, tags=tags,
                              params={f"tuned.{k}": v for k, v in (tuned or {}).items()})
        if hyperparameters is not None:
            from components.tuner import SEARCH_RUN
            from tracking.tuning_runs import adopt

            adopt(tracking, hyperparameters.get_string_custom_property(SEARCH_RUN), delivery.run_id or "")
        # The Registrar continues this MLflow run (and replays undelivered metrics) from here.
        model.set_string_custom_property("mlflow_run_id", delivery.run_id or "")
        model.set_int_custom_property("mlflow_undelivered_metrics", delivery.undelivered)
