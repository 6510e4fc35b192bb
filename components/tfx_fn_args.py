"""TFX's FnArgs for a module file's `run_fn`, built as TFX's Trainer executor builds it
(`fn_args_utils.get_common_fn_args`, then the Trainer's own fields)."""
from __future__ import annotations

import json

from tfx.components.trainer import fn_args_utils
from tfx.proto import trainer_pb2
from tfx.utils import path_utils, proto_utils


def trainer_fn_args(examples, schema, transform_graph, model, model_run, config) -> fn_args_utils.FnArgs:
    """`examples`: the Examples the run_fn trains on (the Transform's, when there is one);
    `config`: the `trainer:` section (TrainerConfig)."""
    input_dict = {"examples": [examples]}
    if schema is not None:
        input_dict["schema"] = [schema]
    if transform_graph is not None:
        input_dict["transform_graph"] = [transform_graph]
    exec_properties = {
        "train_args": proto_utils.proto_to_json(trainer_pb2.TrainArgs(num_steps=config.train_steps or 0)),
        "eval_args": proto_utils.proto_to_json(trainer_pb2.EvalArgs(num_steps=config.eval_steps or 0)),
        "custom_config": json.dumps(config.custom_config),
    }
    fn_args = fn_args_utils.get_common_fn_args(input_dict, exec_properties, working_dir=model_run.uri)
    fn_args.transform_output = fn_args.transform_graph_path
    fn_args.serving_model_dir = path_utils.serving_model_dir(model.uri)
    fn_args.eval_model_dir = path_utils.eval_model_dir(model.uri)
    fn_args.model_run_dir = model_run.uri
    fn_args.schema_file = fn_args.schema_path
    fn_args.hyperparameters = None  # a Tuner's best hyperparameters (no Tuner step yet)
    return fn_args
