"""`loopline monitor` and `loopline infer` as Kubeflow Pipelines steps (infra/kubeflow/*.yaml):
each loads with KFP's own loader, compiles into a pipeline, and the command a pod would run
(placeholders resolved as KFP's launcher does: an input's value, Concat joined, IfPresent
expanded only for a given input) is a valid loopline command line on the image's config."""
from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.conftest import REPO

KUBEFLOW = REPO / "infra" / "kubeflow"
_PARAMETER = re.compile(r"\{\{\$\.inputs\.parameters\['([^']+)'\]\}\}")


def resolve(command: list[str], values: dict) -> list[str]:
    out = []
    for part in command:
        placeholder = json.loads(part) if part.startswith('{"') else None
        if placeholder is None:
            out.append(_PARAMETER.sub(lambda m: str(values[m[1]]), part))
        elif "Concat" in placeholder:
            out.append("".join(resolve(placeholder["Concat"], values)))
        elif "IfPresent" in placeholder:
            branch = placeholder["IfPresent"]
            chosen = branch.get("Then", []) if branch["InputName"] in values else branch.get("Else", [])
            out += resolve(chosen, values)
        else:
            raise AssertionError(f"a placeholder the launcher would not resolve: {part}")
    return out


def compiled_command(tmp_path, component_file: str, **given) -> tuple[list[str], dict]:
    """The step's container command from a compiled one-step pipeline, and its inputs' values."""
    from kfp import compiler, components, dsl

    step = components.load_component_from_file(str(KUBEFLOW / component_file))

    @dsl.pipeline(name="loopline-step")
    def pipeline():
        step(**given)

    compiler.Compiler().compile(pipeline, str(tmp_path / "spec.yaml"))
    spec = yaml.safe_load((tmp_path / "spec.yaml").read_text())
    (executor,) = spec["deploymentSpec"]["executors"].values()
    (task,) = spec["root"]["dag"]["tasks"].values()
    (component,) = spec["components"].values()
    parameters = component["inputDefinitions"]["parameters"]
    defaults = {name: p["defaultValue"] for name, p in parameters.items() if "defaultValue" in p}
    values = {**defaults, **{n: v["runtimeValue"]["constant"] for n, v in task["inputs"]["parameters"].items()}}
    # The IR holds numbers as protobuf doubles; the launcher writes an integer parameter as one.
    values = {n: int(v) if parameters[n]["parameterType"] == "NUMBER_INTEGER" else v for n, v in values.items()}
    assert executor["container"]["image"] == "REGISTRY/loopline:TAG"
    return resolve(executor["container"]["command"], values), values


def parsed(command: list[str]):
    from pipeline.cli import build_parser
    from pipeline.config import load_config

    assert command[0] == "loopline"
    args = build_parser().parse_args(command[1:])
    config_file = args.config.replace("/opt/loopline/", str(REPO) + "/")  # where the image keeps loopline.yaml
    return args, load_config(config_file, args.overrides)


CLUSTER = {"pipeline_root": "gs://bucket/loopline", "mlflow_tracking_uri": "http://mlflow.loopline.svc.cluster.local:5000"}


@pytest.mark.parametrize("labels", [None, "gs://bucket/labels/2026-12-01.parquet"])
def test_monitor_step_runs_loopline_monitor_on_the_cluster_root(tmp_path, labels):
    given = {**CLUSTER, **({"labels": labels} if labels else {})}
    command, _ = compiled_command(tmp_path, "monitor-component.yaml", **given)
    args, config = parsed(command)
    assert args.func.__name__ == "cmd_monitor" and args.since == "P1D" and args.labels == labels
    assert config.pipeline.root == "gs://bucket/loopline" and config.serving.model_name == "penguins"
    assert config.mlflow.tracking_uri == CLUSTER["mlflow_tracking_uri"]


@pytest.mark.parametrize("version", [None, 1796089037])
def test_infer_step_runs_loopline_infer_into_the_bucket(tmp_path, version):
    given = {**CLUSTER, "data": "gs://bucket/data/new-*.parquet", "data_format": "parquet",
             "output": "gs://bucket/predictions/new.parquet", **({"version": version} if version else {})}
    command, _ = compiled_command(tmp_path, "infer-component.yaml", **given)
    args, config = parsed(command)
    assert args.func.__name__ == "cmd_infer" and args.version == version and args.no_progress
    assert (args.data, args.format, args.output) == (given["data"], "parquet", given["output"])
    assert config.pipeline.root == "gs://bucket/loopline"
