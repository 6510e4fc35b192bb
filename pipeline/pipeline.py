"""The TFX pipeline, built from a LooplineConfig; runners live in their own modules."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tfx.components.example_gen.csv_example_gen.component import CsvExampleGen
from tfx.components.pusher.component import Pusher
from tfx.orchestration import metadata
from tfx.orchestration import pipeline as tfx_pipeline
from tfx.proto import pusher_pb2

from components.baseline_recorder import BaselineRecorder
from components.csv_example_gen import ArrowCsvExampleGen
from components.evaluator import Evaluator
from components.example_validator import DataGate, ExampleValidator
from components.schema_gen import SchemaGen
from components.statistics_gen import StatisticsGen
from components.registrar import Registrar
from components.trainer import Trainer
from pipeline.config import LooplineConfig
from pipeline.tracking_setup import registered_model_name, tracking_target


def tfx_root(config: LooplineConfig) -> str:
    return os.path.join(config.pipeline.root, "tfx")


def metadata_path(config: LooplineConfig) -> str:
    return os.path.join(config.pipeline.root, "metadata.sqlite")


def serving_base(config: LooplineConfig) -> str:
    """`<pipeline.root>/serving/<model name>`: TF Serving's base_path for the model."""
    return os.path.join(config.pipeline.root, "serving", config.serving.model_name)


def data_baseline_dir(config: LooplineConfig) -> str:
    """`<pipeline.root>/baseline/<model name>`: the schema and statistics new data is checked against."""
    from validation.baseline import baseline_dir

    return baseline_dir(config.pipeline.root, config.serving.model_name)


def _module_digest(path: str | None) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path and os.path.isfile(path) else ""


def _split_input(path: str, eval_path: str | None, data_format: str) -> tuple[str, "example_gen_pb2.Input"]:
    """ExampleGen's input folder and split patterns: data.path (a file or glob, or for
    image_folder a folder of class folders) as one split to cut 2:1, or data.path and
    data.eval_path as the train and eval splits."""
    from tfx.proto import example_gen_pb2

    def pattern(p: str, base: str) -> str:
        relative = os.path.relpath(p, base)
        if data_format != "image_folder":
            return relative
        return os.path.join("*", "*") if relative == "." else os.path.join(relative, "*", "*")

    if not eval_path:
        base = path if data_format == "image_folder" else os.path.dirname(path)
        return base, example_gen_pb2.Input(splits=[example_gen_pb2.Input.Split(name="single_split", pattern=pattern(path, base))])
    base = os.path.commonpath([os.path.dirname(path), os.path.dirname(eval_path)])
    return base, example_gen_pb2.Input(splits=[
        example_gen_pb2.Input.Split(name="train", pattern=pattern(path, base)),
        example_gen_pb2.Input.Split(name="eval", pattern=pattern(eval_path, base)),
    ])


def _example_gen(data):
    """The ExampleGen of data.format; one node id for all (artifact paths stay the same)."""
    data_dir, input_config = _split_input(data.path, data.eval_path, data.format)
    if data.format == "tfrecord":  # TFX's own; Beam reads a .gz file as GZIP (compression AUTO)
        from tfx.components import ImportExampleGen as example_gen_class
    elif data.format == "parquet":
        from components.file_example_gen import ParquetExampleGen as example_gen_class
    elif data.format == "image_folder":
        from components.file_example_gen import ImageFolderExampleGen as example_gen_class
    else:
        example_gen_class = CsvExampleGen if data.example_gen == "stock" else ArrowCsvExampleGen
    return example_gen_class(input_base=data_dir, input_config=input_config).with_id("CsvExampleGen")


def create_pipeline(config: LooplineConfig, *, local_metadata: bool = True) -> tfx_pipeline.Pipeline:
    """`local_metadata=False` leaves ML Metadata to the orchestrator (Kubeflow brings its own)."""
    example_gen = _example_gen(config.data)
    statistics_gen = StatisticsGen(examples=example_gen.outputs["examples"])
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
    )
    data_gate = DataGate(anomalies=example_validator.outputs["anomalies"], warn_only=int(config.validation.warn_only))
    target = tracking_target(config)
    trainer = Trainer(
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
    # The champion: the version behind the champion alias's TF Serving label, else the last pushed.
    evaluator = Evaluator(
        examples=example_gen.outputs["examples"],
        model=trainer.outputs["model"],
        evaluator_config=config.evaluator.model_dump_json(),
        serving_root=os.path.dirname(serving_base(config)),
        model_name=config.serving.model_name,
        champion_label=config.mlflow.alias_labels.get("champion", ""),
        anomalies=example_validator.outputs["anomalies"],
    )
    trainer.add_upstream_node(data_gate)  # no training on data that failed validation
    pusher = Pusher(
        model=trainer.outputs["model"],
        model_blessing=evaluator.outputs["blessing"],
        push_destination=pusher_pb2.PushDestination(
            filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=serving_base(config))
        ),
    )
    # A pushed model's data becomes the baseline the next runs are checked against.
    baseline_recorder = BaselineRecorder(
        statistics=statistics_gen.outputs["statistics"],
        schema=schema_gen.outputs["schema"],
        pushed_model=pusher.outputs["pushed_model"],
        baseline_dir=baseline,
    )
    components = [example_gen, statistics_gen, schema_gen, example_validator, data_gate, trainer, evaluator, pusher,
                  baseline_recorder]
    if target:
        components.append(Registrar(
            model=trainer.outputs["model"],
            model_run=trainer.outputs["model_run"],
            blessing=evaluator.outputs["blessing"],
            pushed_model=pusher.outputs["pushed_model"],
            examples=example_gen.outputs["examples"],
            statistics=statistics_gen.outputs["statistics"],
            schema=schema_gen.outputs["schema"],
            tracking=target.to_json(),
            registered_model=registered_model_name(config),
            params=json.dumps({k: str(v) for k, v in config.flat().items()}, sort_keys=True),
            pipeline_name=config.pipeline.name,
        ))
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
