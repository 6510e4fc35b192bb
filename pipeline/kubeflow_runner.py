"""Compiles the pipeline for Kubeflow Pipelines / Vertex AI Pipelines with TFX's KubeflowV2DagRunner.

Nothing runs here: the output is a KFP v2 pipeline spec that a Kubeflow Pipelines or Vertex AI
Pipelines service runs, every component in its own pod from one image (infra/Dockerfile).
`.yaml` output is the PipelineSpec that Kubeflow Pipelines 2 uploads; `.json` is the PipelineJob
that Vertex AI Pipelines takes (it accepts the YAML too).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.config import ConfigError, LooplineConfig
from pipeline.library_env import LIBRARY_ENV


# Schemes every pod can read and write through tf.io.gfile and Beam's file systems without extra
# packages (s3:// and hdfs:// need tensorflow-io, which does not load with TensorFlow 2.21).
REMOTE_SCHEMES = ("gs://",)
# KFP's placeholder for the run's id (kfp.dsl.PIPELINE_JOB_ID_PLACEHOLDER); the backend substitutes it
# in parameter values. The Registrar tags the MLflow run with it.
RUN_ID_PLACEHOLDER = "{{$.pipeline_job_uuid}}"
# Where infra/Dockerfile puts the examples and the default config.
IMAGE_PREFIX = "/opt/loopline/"
# MLflow tracking URIs that a pod can reach (a file store inside a pod dies with the pod).
SHARED_MLFLOW_SCHEMES = ("http://", "https://", "databricks", "postgresql", "mysql", "mssql")


REPO = Path(__file__).resolve().parent.parent


def paths_in_image(config: LooplineConfig) -> LooplineConfig:
    """A module file from this repository's examples/ (trainer.module_file, tuner.module_file,
    transform.module_file) is at IMAGE_PREFIX in the image: point the compiled spec there (the
    content, and so the cache key, is the same)."""
    config = config.model_copy(deep=True)
    for section in (config.trainer, config.tuner, config.transform):
        section.module_file = _in_image(section.module_file)
    return config


def _in_image(module: str | None) -> str | None:
    examples = REPO / "examples"
    if module is None or "://" in module or not Path(module).resolve().is_relative_to(examples):
        return module
    return IMAGE_PREFIX + str(Path(module).resolve().relative_to(REPO))


@dataclass
class CompiledSpec:
    path: str
    tasks: list[str]
    image: str
    pipeline_root: str
    warnings: list[str] = field(default_factory=list)


def check_paths_for_pods(config: LooplineConfig, allow_local_paths: bool = False) -> list[str]:
    """Pods do not see this machine's disk: `pipeline.root` and `data.path` must be remote
    (gs://, s3://, hdfs://) or, with allow_local_paths, on a volume mounted at the same path in
    every pod. Raises ConfigError naming the key; returns warnings for what still works."""
    warnings = []
    data = config.data
    paths = [("pipeline.root", config.pipeline.root), ("data.path", data.path), ("data.eval_path", data.eval_path),
             ("data.schema", data.schema)]
    for key, value in paths:
        if value is None or value.startswith(REMOTE_SCHEMES):
            continue
        if "://" in value:
            raise ConfigError(f"{key}: {value!r} is not a filesystem pods share; use one of {', '.join(REMOTE_SCHEMES)}")
        if not allow_local_paths:
            raise ConfigError(
                f"{key}: {value!r} is a path on this machine, which Kubeflow pods cannot see; "
                f"set it to gs://... (e.g. --set {key}=gs://BUCKET/...), or pass "
                "--allow-local-paths if it is on a volume mounted at that path in every pod"
            )
        warnings.append(f"{key}: {value} must be on a volume mounted at that path in every pod")
    for key, module in (("trainer.module_file", config.trainer.module_file),
                        ("tuner.module_file", config.tuner.module_file),
                        ("transform.module_file", config.transform.module_file)):
        if module is not None and not module.startswith(IMAGE_PREFIX):
            warnings.append(
                f"{key}: {module} must exist at that path in the image; the image "
                f"ships the examples under {IMAGE_PREFIX}examples/"
            )
    if config.pipeline.enable_cache:
        warnings.append(
            "pipeline.enable_cache: the compiled spec cannot see the data baseline in its cache keys, so after "
            "`loopline data accept` a rerun on unchanged files may reuse the checks that stopped it; compile with "
            "--set pipeline.enable_cache=false for runs on data that changes"
        )
    uri = config.mlflow.tracking_uri
    if config.mlflow.enabled and (uri is None or not uri.startswith(SHARED_MLFLOW_SCHEMES)):
        warnings.append(
            f"mlflow.tracking_uri: {uri!r} is not a tracking server the pods can share; runs logged in one "
            "pod are lost with it (set it to the MLflow server's http(s):// URL)"
        )
    return warnings


def executor_env(config: LooplineConfig) -> dict[str, str]:
    """Environment set on every component's container: the native libraries' (LIBRARY_ENV), and
    MLflow's names, which it reads itself."""
    env = {**LIBRARY_ENV, "MLFLOW_EXPERIMENT_NAME": config.mlflow.experiment}
    if config.mlflow.tracking_uri:
        env["MLFLOW_TRACKING_URI"] = config.mlflow.tracking_uri
    return env


def compile_kubeflow(
    config: LooplineConfig,
    image: str,
    output: str | os.PathLike,
    allow_local_paths: bool = False,
) -> CompiledSpec:
    """Writes the pipeline spec to `output` (.json: PipelineJob; .yaml/.yml: PipelineSpec). What
    still works but needs care is in the result's `warnings`, for the caller to show once."""
    if not image or any(c.isspace() for c in image):
        raise ConfigError(f"--image: {image!r} is not a container image reference")
    output = Path(output)
    if output.suffix not in (".json", ".yaml", ".yml"):
        raise ConfigError(f"--output: {output} must end in .json (Vertex PipelineJob) or .yaml (KFP PipelineSpec)")
    config = paths_in_image(config).model_copy(deep=True)
    warnings = check_paths_for_pods(config, allow_local_paths)
    # ML Metadata is the orchestrator's; a local SQLite path must not reach the spec (parameters).
    config.pipeline.metadata_path = None
    from pipeline.tracking_setup import tracking_target

    tracking_target(config)  # a remote root without mlflow.tracking_uri stops here, naming the key
    # Imported after the checks: a refused config costs no TensorFlow import.
    from tfx.orchestration.kubeflow.v2 import kubeflow_v2_dag_runner as kfv2

    from pipeline.pipeline import create_pipeline, tfx_root

    # The KFP backend brings ML Metadata.
    tfx_pipeline = create_pipeline(config, local_metadata=False, run_id_placeholder=RUN_ID_PLACEHOLDER)
    runner = kfv2.KubeflowV2DagRunner(
        config=kfv2.KubeflowV2DagRunnerConfig(
            display_name=config.pipeline.name,
            default_image=image,
            use_pipeline_spec_2_1=True,  # the schema Kubeflow Pipelines 2 and Vertex both take
        ),
    )
    job = runner.run(tfx_pipeline, write_out=False)
    spec = job["pipelineSpec"]
    # The YAML form carries no runtimeConfig; the spec's default root keeps pipeline.root in it.
    spec["defaultPipelineRoot"] = tfx_root(config)
    for executor in spec["deploymentSpec"]["executors"].values():
        executor["container"]["env"] = [{"name": k, "value": v} for k, v in sorted(executor_env(config).items())]

    output.parent.mkdir(parents=True, exist_ok=True)
    if output.suffix == ".json":
        output.write_text(json.dumps(job, indent=2, sort_keys=True))
    else:
        import yaml

        header = f"# PIPELINE DEFINITION\n# Name: {config.pipeline.name}\n# Compiled by loopline with TFX's KubeflowV2DagRunner\n"
        output.write_text(header + yaml.safe_dump(spec, sort_keys=True))
    return CompiledSpec(
        path=str(output),
        tasks=[c.id for c in tfx_pipeline.components],  # in run order
        image=image,
        pipeline_root=tfx_root(config),
        warnings=warnings,
    )
