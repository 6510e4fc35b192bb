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


def _module_digest(path: str | None) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path and os.path.isfile(path) else ""


def create_pipeline(config: LooplineConfig) -> tfx_pipeline.Pipeline:
    # ExampleGen reads a folder; the folder of data.path with a pattern naming the file.
    data_dir, data_file = os.path.split(config.data.path)
    from tfx.proto import example_gen_pb2

    example_gen = CsvExampleGen(
        input_base=data_dir,
        input_config=example_gen_pb2.Input(splits=[example_gen_pb2.Input.Split(name="single_split", pattern=data_file)]),
    )
    target = tracking_target(config)
    trainer = Trainer(
        examples=example_gen.outputs["examples"],
        trainer_config=config.trainer.model_dump_json(),
        label=config.data.label,
        module_sha256=_module_digest(config.trainer.module_file),
        tracking=target.to_json() if target else "",
    )
    pusher = Pusher(
        model=trainer.outputs["model"],
        push_destination=pusher_pb2.PushDestination(
            filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=serving_base(config))
        ),
    )
    components = [example_gen, trainer, pusher]
    if target:
        components.append(Registrar(
            model=trainer.outputs["model"],
            model_run=trainer.outputs["model_run"],
            pushed_model=pusher.outputs["pushed_model"],
            examples=example_gen.outputs["examples"],
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
        metadata_connection_config=metadata.sqlite_metadata_connection_config(metadata_path(config)),
    )
