"""Writes TF Serving's models.config, batching.config and monitoring.config beside a pushed model,
as a pipeline step, so a run on any orchestrator (a Kubeflow pod too) leaves the server's files."""

import logging

from tfx.dsl.component.experimental.annotations import InputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component
from tfx.types.standard_artifacts import PushedModel


@component
def ServingConfigs(pushed_model: InputArtifact[PushedModel], serving_root: Parameter[str],
                   serving_config: Parameter[str], request_log_dir: Parameter[str] = "") -> None:
    """`serving_config` is the part of the `serving:` section the files hold (model name,
    versions kept, batching, request logging) as JSON; nothing is written when the model was not
    pushed. With `request_log_dir`, loopline's request_log.json goes beside them."""
    from serving.config import ServingConfig
    from serving.config_writer import write_serving_configs
    from serving.request_log_config import write_request_log_file

    log = logging.getLogger("loopline")
    if pushed_model.get_int_custom_property("pushed") != 1:
        log.info("serving configs: the model was not pushed; %s unchanged", serving_root)
        return
    config = ServingConfig.model_validate_json(serving_config)
    written = write_serving_configs(serving_root, config)
    if request_log_dir:  # loopline's own file: models.config must stay loadable by TF Serving
        written["request_log.json"] = write_request_log_file(serving_root, config.request_log, request_log_dir)
    log.info("serving configs: %s", ", ".join(sorted(written.values())))
