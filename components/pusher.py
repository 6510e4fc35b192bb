"""The pipeline's Pusher: TFX's Pusher with a push that never collides and never skips
(serving.push), followed by retention (serving.retention).

TFX's own executor names a version by Unix seconds and, when that folder exists, skips the copy
but still records the push, so two runs in one second both claim one folder. This one publishes
under a number no one else holds and records the folder it wrote. The spec, the input and output
types and the output's properties (`pushed`, `pushed_version`, `pushed_destination`) are TFX's,
so everything downstream (and a Kubeflow spec) reads it as before.
"""
from __future__ import annotations

import logging
import os
from typing import Any

from tfx import types
from tfx.components.pusher import executor as tfx_pusher
from tfx.dsl.components.base import base_component, executor_spec
from tfx.proto import pusher_pb2
from tfx.types import artifact_utils, standard_artifacts, standard_component_specs
from tfx.types.component_spec import ExecutionParameter
from tfx.utils import io_utils, proto_utils


class PusherSpec(standard_component_specs.PusherSpec):
    PARAMETERS = {
        **standard_component_specs.PusherSpec.PARAMETERS,
        "keep_versions": ExecutionParameter(type=int),
        # Where the registry is (tracking.target.TrackingTarget as JSON), to keep the versions its
        # aliases point to; "" without one.
        "tracking": ExecutionParameter(type=str, optional=True),
        "registered_model": ExecutionParameter(type=str, optional=True),
        # The TFLite variant published as the version's model.tflite (serving.tflite_variant).
        "tflite_variant": ExecutionParameter(type=str, optional=True),
    }


class PusherExecutor(tfx_pusher.Executor):
    def Do(self, input_dict: dict[str, list[types.Artifact]], output_dict: dict[str, list[types.Artifact]],
           exec_properties: dict[str, Any]) -> None:
        from serving.push import push_model

        logging.getLogger("loopline").setLevel(logging.INFO)
        pushed = artifact_utils.get_single_instance(output_dict[standard_component_specs.PUSHED_MODEL_KEY])
        if not self.CheckBlessing(input_dict):
            self._MarkNotPushed(pushed)
            return
        model_path = self.GetModelPath(input_dict)
        destination = pusher_pb2.PushDestination()
        proto_utils.json_to_proto(exec_properties[standard_component_specs.PUSH_DESTINATION_KEY], destination)
        base = destination.filesystem.base_directory
        result = push_model(model_path, base, _tflite_model(input_dict, exec_properties.get("tflite_variant") or ""))
        io_utils.copy_dir(model_path, pushed.uri)  # the archive copy TFX's Pusher keeps
        self._MarkPushed(pushed, pushed_destination=result.path, pushed_version=str(result.version))
        _retain(base, exec_properties)


def _tflite_model(input_dict: dict[str, list[types.Artifact]], variant: str) -> str | None:
    """The model's TFLite `variant` as the Trainer exported it; None when it was not exported or
    was dropped by the parity gate (the push then has no model.tflite)."""
    import tensorflow as tf

    from trainer.export import TFLITE_DIR

    if not variant:
        return None
    model_uri = artifact_utils.get_single_uri(input_dict[standard_component_specs.MODEL_KEY])
    path = os.path.join(model_uri, TFLITE_DIR, f"model_{variant}.tflite")
    if not tf.io.gfile.exists(path):
        logging.getLogger("loopline").warning("no TFLite %s variant in %s: the version is pushed without model.tflite",
                                              variant, model_uri)
        return None
    return path


def _retain(base: str, exec_properties: dict[str, Any]) -> None:
    from serving.retention import apply_retention

    tracking, model = exec_properties.get("tracking") or "", exec_properties.get("registered_model") or ""
    registry_versions = None
    if tracking:
        def registry_versions() -> set[int]:
            from tracking.promotion import aliased_serving_versions
            from tracking.target import TrackingTarget, make_client

            return aliased_serving_versions(make_client(TrackingTarget.from_json(tracking)), model)

    serving_root, name = os.path.split(base.rstrip("/"))
    apply_retention(serving_root, name, int(exec_properties["keep_versions"]), registry_versions)


class Pusher(base_component.BaseComponent):
    """Pushes a blessed model to `base_directory` (TF Serving's base path for the model) as a new
    version, then keeps the newest `keep_versions` there (and what models.config or an alias of
    `registered_model` in the registry at `tracking` names). The model's TFLite `tflite_variant`
    goes into the version as model.tflite ("": none)."""

    SPEC_CLASS = PusherSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(PusherExecutor)

    def __init__(self, model, model_blessing, base_directory: str, keep_versions: int, tracking: str = "",
                 registered_model: str = "", tflite_variant: str = "float32"):
        super().__init__(PusherSpec(
            model=model, model_blessing=model_blessing,
            push_destination=pusher_pb2.PushDestination(
                filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=base_directory)),
            keep_versions=keep_versions, tracking=tracking, registered_model=registered_model,
            tflite_variant=tflite_variant,
            pushed_model=types.Channel(type=standard_artifacts.PushedModel),
        ))
