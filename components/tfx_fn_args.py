"""TFX's FnArgs for a module file's `run_fn` and `tuner_fn`, built as TFX's Trainer and Tuner
executors build them (`fn_args_utils.get_common_fn_args`, then the Trainer's own fields)."""
from __future__ import annotations

import json

from tfx.components.trainer import fn_args_utils
from tfx.proto import trainer_pb2
from tfx.utils import io_utils, path_utils, proto_utils

BEST_HYPERPARAMETERS_FILE = "best_hyperparameters.txt"  # TFX's Tuner's file in its HyperParameters artifact


def common_fn_args(examples, schema, transform_graph, config, working_dir: str) -> fn_args_utils.FnArgs:
    """What TFX's Trainer and Tuner both give: `examples` (the Transform's, when there is one),
    the schema, the transform graph, train/eval steps and custom_config from `config` (the
    `trainer:` section, TrainerConfig), and `working_dir`."""
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
    fn_args = fn_args_utils.get_common_fn_args(input_dict, exec_properties, working_dir=working_dir)
    fn_args.transform_output = fn_args.transform_graph_path
    return fn_args


def trainer_fn_args(examples, schema, transform_graph, model, model_run, config,
                    hyperparameters=None) -> fn_args_utils.FnArgs:
    """`config`: the `trainer:` section (TrainerConfig); `hyperparameters`: the Tuner's
    HyperParameters artifact, None without a Tuner step."""
    fn_args = common_fn_args(examples, schema, transform_graph, config, working_dir=model_run.uri)
    fn_args.serving_model_dir = path_utils.serving_model_dir(model.uri)
    fn_args.eval_model_dir = path_utils.eval_model_dir(model.uri)
    fn_args.model_run_dir = model_run.uri
    fn_args.schema_file = fn_args.schema_path
    fn_args.hyperparameters = None if hyperparameters is None else read_best_hyperparameters(hyperparameters.uri)
    return fn_args


def read_best_hyperparameters(uri: str) -> dict:
    """The HyperParameters config a Tuner wrote (the one file in the artifact, as TFX's Trainer reads it)."""
    with_file = io_utils.get_only_uri_in_dir(uri)
    return json.loads(io_utils.read_string_file(with_file))
