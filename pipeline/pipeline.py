"""The TFX pipeline, built from a LooplineConfig; runners live in their own modules."""
from __future__ import annotations

import hashlib
import json
import os
import posixpath

from tfx.components.example_gen.csv_example_gen.component import CsvExampleGen
from tfx.orchestration import metadata
from tfx.orchestration import pipeline as tfx_pipeline

from components.baseline_recorder import BaselineRecorder
from components.csv_example_gen import ArrowCsvExampleGen, custom_config
from components.evaluator import Evaluator
from components.example_validator import DataGate, ExampleValidator
from components.pusher import Pusher
from components.schema_gen import SchemaGen
from components.serving_configs import ServingConfigs
from components.statistics_gen import StatisticsGen
from components.registrar import Registrar
from components.trainer import Trainer
from components.transform import Transform
from components.tuner import Tuner
from pipeline.checks import check_stock_options
from pipeline.config import ConfigError, LooplineConfig, is_remote
from pipeline.tracking_setup import registered_model_name, tracking_target
from serving.request_log_config import request_log_dir
from trainer.tfx_contract import defines_function, defines_run_fn


def tfx_root(config: LooplineConfig) -> str:
    return os.path.join(config.pipeline.root, "tfx")


def metadata_path(config: LooplineConfig) -> str:
    """ML Metadata's SQLite file: `pipeline.metadata_path`, else `<root>/metadata.sqlite` for a
    local root. SQLite needs a file on this machine, so a remote root needs the key."""
    section = config.pipeline
    if section.metadata_path is not None:
        if is_remote(section.metadata_path):
            raise ConfigError(f"pipeline.metadata_path: {section.metadata_path!r} must be a local file (SQLite)")
        return section.metadata_path
    if is_remote(section.root):
        raise ConfigError(
            f"pipeline.metadata_path is required when pipeline.root is remote ({section.root}): "
            "ML Metadata's SQLite file must be on this machine (e.g. --set pipeline.metadata_path=metadata.sqlite)")
    return os.path.join(section.root, "metadata.sqlite")


def serving_base(config: LooplineConfig) -> str:
    """`<pipeline.root>/serving/<model name>`: TF Serving's base_path for the model."""
    return os.path.join(config.pipeline.root, "serving", config.serving.model_name)


def data_baseline_dir(config: LooplineConfig) -> str:
    """`<pipeline.root>/baseline/<model name>`: the schema and statistics new data is checked against."""
    from validation.baseline import baseline_dir

    return baseline_dir(config.pipeline.root, config.serving.model_name)


def _module_digest(path: str | None) -> str:
    import tensorflow as tf

    if not path or not tf.io.gfile.exists(path):
        return ""
    with tf.io.gfile.GFile(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _is_tfx_module(path: str | None) -> bool:
    """A TFX module file (run_fn) on this machine; a compiled spec's image path is not read."""
    import tensorflow as tf

    return bool(path) and tf.io.gfile.exists(path) and defines_run_fn(path)


def _loopline_module(path: str | None) -> str | None:
    """`path` unless it is a TFX module file, which declares no labels: data.label is read by the
    generic rules."""
    return None if _is_tfx_module(path) else path


def _split_input(path: str, eval_path: str | None, data_format: str) -> tuple[str, "example_gen_pb2.Input"]:
    """ExampleGen's input folder and split patterns: data.path (a file or glob, or for
    image_folder a folder of class folders) as one split to cut 2:1, or data.path and
    data.eval_path as the train and eval splits. URIs keep their `scheme://` (os.path.commonpath
    would fold `gs://b` into `gs:/b`)."""
    from tfx.proto import example_gen_pb2

    scheme, sep, rest = path.rpartition("://")
    paths = posixpath if sep else os.path

    def pattern(p: str, base: str) -> str:
        relative = paths.relpath(p, base)
        if data_format != "image_folder":
            return relative
        return paths.join("*", "*") if relative == "." else paths.join(relative, "*", "*")

    if not eval_path:
        base = rest if data_format == "image_folder" else paths.dirname(rest)
        return scheme + sep + base, example_gen_pb2.Input(
            splits=[example_gen_pb2.Input.Split(name="single_split", pattern=pattern(rest, base))])
    eval_scheme, eval_sep, eval_rest = eval_path.rpartition("://")
    if (scheme, sep) != (eval_scheme, eval_sep):
        raise ConfigError(f"data.eval_path: {eval_path} must be on the same filesystem as data.path ({path})")
    base = paths.commonpath([paths.dirname(rest), paths.dirname(eval_rest)])
    return scheme + sep + base, example_gen_pb2.Input(splits=[
        example_gen_pb2.Input.Split(name="train", pattern=pattern(rest, base)),
        example_gen_pb2.Input.Split(name="eval", pattern=pattern(eval_rest, base)),
    ])


def _example_gen(data):
    """The ExampleGen of data.format; one node id for all (artifact paths stay the same)."""
    data_dir, input_config = _split_input(data.path, data.eval_path, data.format)
    if data.format == "tfrecord":  # ImportExampleGen's splits, each record checked; a .gz file is GZIP
        from components.file_example_gen import TFRecordExampleGen as example_gen_class
    elif data.format == "parquet":
        from components.file_example_gen import ParquetExampleGen as example_gen_class
    elif data.format == "image_folder":
        from components.file_example_gen import ImageFolderExampleGen as example_gen_class
    elif data.example_gen == "stock":
        check_stock_options(data)
        example_gen_class = CsvExampleGen
    else:  # the CSV options travel in custom_config: a changed option is a changed execution, not a cache hit
        return ArrowCsvExampleGen(input_base=data_dir, input_config=input_config,
                                  custom_config=custom_config(data.csv_options())).with_id("CsvExampleGen")
    return example_gen_class(input_base=data_dir, input_config=input_config).with_id("CsvExampleGen")


def create_pipeline(config: LooplineConfig, *, local_metadata: bool = True,
                    run_id_placeholder: str | None = None) -> tfx_pipeline.Pipeline:
    """`local_metadata=False` leaves ML Metadata to the orchestrator (Kubeflow brings its own);
    `run_id_placeholder` is how the orchestrator writes the run's id into a parameter, for
    executors it does not tell (Kubeflow's v2 entry point)."""
    example_gen = _example_gen(config.data)
    statistics_gen = StatisticsGen(examples=example_gen.outputs["examples"])
    schema_gen, example_validator, data_gate = _data_validation(config, example_gen, statistics_gen, local_metadata)
    target = tracking_target(config)
    transform = _transform(config, example_gen, statistics_gen, schema_gen)
    if transform is not None:
        transform.add_upstream_node(data_gate)  # no analysis of data that failed validation
    tuner = _tuner(config, target, example_gen, schema_gen, transform, check_files=local_metadata)
    if tuner is not None:
        tuner.add_upstream_node(data_gate)  # no search on data that failed validation
    trainer, evaluator = _training(config, target, example_gen, statistics_gen, schema_gen, example_validator,
                                   transform, tuner)
    trainer.add_upstream_node(data_gate)  # no training on data that failed validation
    pusher, baseline_recorder, serving_configs = _delivery(config, target, example_gen, trainer, evaluator,
                                                           statistics_gen, schema_gen)
    components = [example_gen, statistics_gen, schema_gen, example_validator, data_gate, *filter(None, [transform, tuner]),
                  trainer, evaluator, pusher, baseline_recorder, serving_configs]
    if target:
        components.append(_registrar(config, target, example_gen, statistics_gen, schema_gen, trainer, evaluator,
                                     pusher, run_id_placeholder))
    return tfx_pipeline.Pipeline(
        pipeline_name=config.pipeline.name,
        pipeline_root=tfx_root(config),
        components=components,
        enable_cache=config.pipeline.enable_cache,
        metadata_connection_config=(
            metadata.sqlite_metadata_connection_config(metadata_path(config)) if local_metadata else None
        ),
        beam_pipeline_args=list(config.pipeline.beam_args),
    )


def _data_validation(config: LooplineConfig, example_gen, statistics_gen, local_metadata: bool):
    """SchemaGen, ExampleValidator and the DataGate that stops the run before training."""
    from validation.baseline import cache_key

    baseline = data_baseline_dir(config)
    # The cache must not reuse a schema or a check made before an accepted baseline. A compiled
    # spec is fixed before the runs it serves, so it carries none (see kubeflow_runner's warning).
    baseline_digest = cache_key(baseline) if local_metadata else ""
    schema_gen = SchemaGen(
        statistics=statistics_gen.outputs["statistics"],
        validation_config=config.validation.model_dump_json(),
        curated_schema=config.data.schema or "",
        curated_sha256=_module_digest(config.data.schema),
        baseline_dir=baseline,
        baseline_cache_key=baseline_digest,
    )
    example_validator = ExampleValidator(
        statistics=statistics_gen.outputs["statistics"],
        schema=schema_gen.outputs["schema"],
        validation_config=config.validation.model_dump_json(),
        baseline_dir=baseline,
        baseline_cache_key=baseline_digest,
        # The labels, by the Trainer's rules, for the check of eval classes the train split lacks.
        examples=example_gen.outputs["examples"],
        labels_config=json.dumps({"label": config.data.label, "label_kind": config.data.label_kind,
                                  "module_file": _loopline_module(config.trainer.module_file)}),
        module_sha256=_module_digest(config.trainer.module_file),
    )
    data_gate = DataGate(anomalies=example_validator.outputs["anomalies"], warn_only=int(config.validation.warn_only))
    return schema_gen, example_validator, data_gate


def _transform(config: LooplineConfig, example_gen, statistics_gen, schema_gen):
    """TFX's Transform step (`transform.module_file`'s preprocessing_fn), None when it is off."""
    module_file = config.transform.module_file
    if module_file is None:
        return None
    if not is_remote(module_file):  # stop before any work, not when the Transform starts
        if not os.path.isfile(module_file):
            raise ConfigError(f"transform.module_file: no such file: {module_file}")
        if not defines_function(module_file, "preprocessing_fn"):
            raise ConfigError(f"transform.module_file: {module_file} defines no preprocessing_fn(inputs) at its top level")
    return Transform(examples=example_gen.outputs["examples"], schema=schema_gen.outputs["schema"],
                     statistics=statistics_gen.outputs["statistics"], module_file=module_file,
                     module_sha256=_module_digest(module_file))


def _transformed(transform) -> dict:
    """The Transform step's outputs as a Trainer's or Tuner's inputs ({} without one)."""
    return {} if transform is None else {"transform_graph": transform.outputs["transform_graph"],
                                         "transformed_examples": transform.outputs["transformed_examples"]}


def _tuner(config: LooplineConfig, target, example_gen, schema_gen, transform, check_files: bool = True):
    """The Tuner step (`tuner.module_file`'s tuner_fn, or loopline's search with tuner.enabled),
    None when it is off; `check_files`: the module file is on this machine (not in a compiled
    spec's image). Its cache key holds the search space and the trainer's settings (the
    configs), and the tuner's and trainer's module files' digests: unchanged data, space and
    modules reuse the last search."""
    section = config.tuner
    if not section.on:
        return None
    module_file = section.module_file
    if module_file is not None and check_files and not is_remote(module_file):  # stop before any work
        if not os.path.isfile(module_file):
            raise ConfigError(f"tuner.module_file: no such file: {module_file}")
        if not defines_function(module_file, "tuner_fn"):
            raise ConfigError(f"tuner.module_file: {module_file} defines no tuner_fn(fn_args) at its top level")
    if module_file is None and _is_tfx_module(config.trainer.module_file):
        raise ConfigError("tuner.enabled: trainer.module_file is a TFX module file (run_fn): loopline's search tunes "
                          "loopline's models; set tuner.module_file to a module with tuner_fn(fn_args)")
    return Tuner(
        **_transformed(transform),
        examples=example_gen.outputs["examples"],
        schema=schema_gen.outputs["schema"],
        tuner_config=section.model_dump_json(),
        trainer_config=config.trainer.model_dump_json(),
        label=config.data.label,
        label_kind=config.data.label_kind,
        max_classes=config.data.max_classes or 0,
        module_sha256=tuner_cache_digest(config),
        tracking=target.to_json() if target else "",
    )


def tuner_cache_digest(config: LooplineConfig) -> str:
    """The digests of the files a search runs besides the config: the tuner's module file and
    the trainer's (a loopline module's build_model is what trials train)."""
    return ",".join([_module_digest(config.tuner.module_file), _module_digest(config.trainer.module_file)])


def _training(config: LooplineConfig, target, example_gen, statistics_gen, schema_gen, example_validator, transform,
              tuner=None):
    """The Trainer (`target`: where its MLflow run goes, None for none; `transform` and `tuner`:
    the Transform and Tuner steps, None for none), and the Evaluator that blesses its model
    against the champion: the version behind the champion alias's TF Serving label, else the
    last pushed."""
    tuned = {} if tuner is None else {"hyperparameters": tuner.outputs["best_hyperparameters"]}
    trainer = Trainer(
        **_transformed(transform),
        **tuned,
        examples=example_gen.outputs["examples"],
        schema=schema_gen.outputs["schema"],
        trainer_config=config.trainer.model_dump_json(),
        label=config.data.label,
        label_kind=config.data.label_kind,
        max_classes=config.data.max_classes or 0,
        module_sha256=_module_digest(config.trainer.module_file),
        export_config=config.export.model_dump_json(),
        tracking=target.to_json() if target else "",
    )
    evaluator = Evaluator(
        examples=example_gen.outputs["examples"],
        model=trainer.outputs["model"],
        evaluator_config=config.evaluator.model_copy(
            update={"label_key": config.evaluator.label_key or config.data.label}).model_dump_json(),
        serving_root=os.path.dirname(serving_base(config)),
        model_name=config.serving.model_name,
        champion_label=config.mlflow.alias_labels.get("champion", ""),
        anomalies=example_validator.outputs["anomalies"],
        statistics=statistics_gen.outputs["statistics"],  # the trivial model's train labels, where exact
    )
    return trainer, evaluator


def _delivery(config: LooplineConfig, target, example_gen, trainer, evaluator, statistics_gen, schema_gen):
    """The Pusher (a new version, then retention: it keeps what the registry at `target` points
    to), the BaselineRecorder (a pushed model's data becomes the baseline the next runs are
    checked against) and the ServingConfigs writer."""
    pusher = Pusher(
        model=trainer.outputs["model"],
        model_blessing=evaluator.outputs["blessing"],
        base_directory=serving_base(config),
        keep_versions=config.serving.keep_versions,
        tracking=target.to_json() if target else "",
        registered_model=registered_model_name(config),
        # Only a variant the Trainer exports: none asked for, no model.tflite and nothing to warn about.
        tflite_variant=(config.serving.tflite_variant
                        if config.serving.tflite_variant in config.export.tflite_variants else ""),
    )
    baseline_recorder = BaselineRecorder(
        statistics=statistics_gen.outputs["statistics"],
        schema=schema_gen.outputs["schema"],
        pushed_model=pusher.outputs["pushed_model"],
        baseline_dir=data_baseline_dir(config),
        examples=example_gen.outputs["examples"],  # the pushed model's eval predictions, for `loopline monitor`
        blessing=evaluator.outputs["blessing"],  # ... as the Evaluator summarized them
    )
    # Only what the files hold: the rest of `serving:` (ports, TLS paths) stays out of the spec.
    serving_files = config.serving.model_dump_json(include={"model_name", "num_versions", "batching", "request_log"})
    serving_configs = ServingConfigs(pushed_model=pusher.outputs["pushed_model"],
                                     serving_root=os.path.dirname(serving_base(config)),
                                     serving_config=serving_files,
                                     request_log_dir=request_log_dir(config.pipeline.root))
    return pusher, baseline_recorder, serving_configs


def _registrar(config: LooplineConfig, target, example_gen, statistics_gen, schema_gen, trainer, evaluator, pusher,
               run_id_placeholder: str | None):
    """The MLflow Registrar (only with a tracking target)."""
    return Registrar(
        model=trainer.outputs["model"],
        model_run=trainer.outputs["model_run"],
        blessing=evaluator.outputs["blessing"],
        pushed_model=pusher.outputs["pushed_model"],
        examples=example_gen.outputs["examples"],
        statistics=statistics_gen.outputs["statistics"],
        schema=schema_gen.outputs["schema"],
        anomalies=evaluator.inputs["anomalies"],  # the data check (and baseline) the model card names
        tracking=target.to_json(),
        registered_model=registered_model_name(config),
        params=json.dumps({k: str(v) for k, v in config.flat().items()}, sort_keys=True),
        pipeline_name=config.pipeline.name,
        pipeline_run_id=run_id_placeholder,
    )
