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


def create_pipeline(config: LooplineConfig, *, local_metadata: bool = True) -> tfx_pipeline.Pipeline:
    """`local_metadata=False` leaves ML Metadata to the orchestrator (Kubeflow brings its own)."""
    # ExampleGen reads a folder; the folder of data.path with a pattern naming the file.
    data_dir, data_file = os.path.split(config.data.path)
    from tfx.proto import example_gen_pb2

    input_config = example_gen_pb2.Input(splits=[example_gen_pb2.Input.Split(name="single_split", pattern=data_file)])
    if config.data.eval_path:
        # Given splits: one folder above both files, a pattern each.
        data_dir = os.path.commonpath([os.path.dirname(config.data.path), os.path.dirname(config.data.eval_path)])
        input_config = example_gen_pb2.Input(splits=[
            example_gen_pb2.Input.Split(name="train", pattern=os.path.relpath(config.data.path, data_dir)),
            example_gen_pb2.Input.Split(name="eval", pattern=os.path.relpath(config.data.eval_path, data_dir)),
        ])
    example_gen_class = CsvExampleGen if config.data.example_gen == "stock" else ArrowCsvExampleGen
    # One node id whichever reads the CSV: artifact paths and summaries stay the same.
    example_gen = example_gen_class(input_base=data_dir, input_config=input_config).with_id("CsvExampleGen")
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
