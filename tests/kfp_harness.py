"""Executes a compiled KFP v2 pipeline spec (the PipelineJob JSON `loopline compile` writes) the way
the KFP launcher does, for tests: task by task in DAG order, each task's container command and
args exactly as the spec writes them, in a fresh subprocess with its own empty working directory
and HOME, as a pod would.

For each task it builds the ExecutorInput from the spec: the parameter constants (with the run's
`{{$.pipeline_job_uuid}}`-style placeholders substituted, as the KFP driver does), the upstream
tasks' output artifacts with the metadata their producers wrote into their executor output file,
output artifact URIs under the pipeline root, and the output metadata file. A `preCacheCheck`
lifecycle hook (ExampleGen's driver) runs first; its parameter values and output artifacts update
the executor input, as Vertex AI Pipelines does. `{{$}}` in the args is the ExecutorInput JSON.

Not a KFP backend: no caching, no retries, no ML Metadata; the container image is replaced by this
checkout (`image_prefix`, e.g. /opt/loopline/, maps to it) and the shared volume is a local folder.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path


class TaskFailed(RuntimeError):
    pass


@dataclass
class SpecRun:
    run_id: str
    order: list[str] = field(default_factory=list)
    outputs: dict[str, dict] = field(default_factory=dict)  # task -> {output key: RuntimeArtifact JSON}
    logs: dict[str, str] = field(default_factory=dict)


def dag_order(tasks: dict[str, dict]) -> list[str]:
    """Kahn's algorithm over dependentTasks and artifact producers (ties by name)."""
    needs = {}
    for name, task in tasks.items():
        deps = set(task.get("dependentTasks", []))
        for spec in task.get("inputs", {}).get("artifacts", {}).values():
            deps.add(spec["taskOutputArtifact"]["producerTask"])
        needs[name] = deps
    order = []
    while needs:
        ready = sorted(n for n, deps in needs.items() if deps <= set(order))
        if not ready:
            raise ValueError(f"the DAG has a cycle among {sorted(needs)}")
        order.append(ready[0])
        del needs[ready[0]]
    return order


def _substitute(value, placeholders: dict[str, str]):
    if isinstance(value, str):
        for key, replacement in placeholders.items():
            value = value.replace(key, replacement)
    return value


class SpecRunner:
    def __init__(self, job_path: str | os.PathLike, checkout: Path, image_prefix: str, workdir: Path,
                 python_bin_dir: str | None = None, timeout_s: float = 900):
        job = json.loads(Path(job_path).read_text())
        self.spec = job["pipelineSpec"]
        self.root = job.get("runtimeConfig", {}).get("gcsOutputDirectory") or self.spec["defaultPipelineRoot"]
        self.checkout = checkout
        self.image_prefix = image_prefix
        self.workdir = workdir
        self.bin_dir = python_bin_dir or os.path.dirname(sys.executable)
        self.timeout_s = timeout_s

    def run(self, run_id: str | None = None) -> SpecRun:
        run = SpecRun(run_id or uuid.uuid4().hex)
        tasks = self.spec["root"]["dag"]["tasks"]
        run.order = dag_order(tasks)
        for name in run.order:
            run.outputs[name] = self._run_task(run, name, tasks[name])
        return run

    def _placeholders(self, run: SpecRun, task: str) -> dict[str, str]:
        return {
            "{{$.pipeline_job_uuid}}": run.run_id,
            "{{$.pipeline_job_name}}": f"{self.spec['pipelineInfo']['name']}-{run.run_id[:8]}",
            "{{$.pipeline_task_name}}": task,
            "{{$.pipeline_root}}": self.root,
        }

    def _executor_input(self, run: SpecRun, name: str, task: dict, component: dict, task_dir: str) -> dict:
        placeholders = self._placeholders(run, name)
        parameters = {
            key: _substitute(spec["runtimeValue"]["constant"], placeholders)
            for key, spec in task.get("inputs", {}).get("parameters", {}).items()
        }
        input_types = component.get("inputDefinitions", {}).get("artifacts", {})
        artifacts = {}
        for key, spec in task.get("inputs", {}).get("artifacts", {}).items():
            source = spec["taskOutputArtifact"]
            produced = dict(run.outputs[source["producerTask"]][source["outputArtifactKey"]])
            produced["type"] = input_types[key]["artifactType"]
            artifacts[key] = {"artifacts": [produced]}
        outputs = {}
        for key, spec in component.get("outputDefinitions", {}).get("artifacts", {}).items():
            outputs[key] = {"artifacts": [{
                "name": f"{run.run_id}-{name}-{key}",
                "type": spec["artifactType"],
                "uri": f"{task_dir}/{key}",
                "metadata": {},
            }]}
        return {
            "inputs": {"parameterValues": parameters, "artifacts": artifacts},
            "outputs": {"artifacts": outputs, "outputFile": f"{task_dir}/executor_output.json"},
        }

    def _run_task(self, run: SpecRun, name: str, task: dict) -> dict:
        component = self.spec["components"][task["componentRef"]["name"]]
        container = self.spec["deploymentSpec"]["executors"][component["executorLabel"]]["container"]
        task_dir = f"{self.root.rstrip('/')}/{run.run_id}/{name}_{uuid.uuid4().hex[:8]}"
        executor_input = self._executor_input(run, name, task, component, task_dir)
        os.makedirs(task_dir)  # the launcher makes output artifacts' parent folders, not the folders
        env = {item["name"]: item["value"] for item in container.get("env", [])}
        hook = container.get("lifecycle", {}).get("preCacheCheck")
        if hook:
            self._exec(run, f"{name}.preCacheCheck", hook["command"], hook["args"], executor_input, env)
            driver_output = json.loads(Path(executor_input["outputs"]["outputFile"]).read_text())
            executor_input["inputs"]["parameterValues"].update(driver_output.get("parameterValues", {}))
            for key, produced in driver_output.get("artifacts", {}).items():
                declared = executor_input["outputs"]["artifacts"][key]["artifacts"][0]
                declared["metadata"] = produced["artifacts"][0].get("metadata", {})
        self._exec(run, name, container["command"], container["args"], executor_input, env)
        written = json.loads(Path(executor_input["outputs"]["outputFile"]).read_text())
        outputs = {}
        for key, declared_list in executor_input["outputs"]["artifacts"].items():
            declared = declared_list["artifacts"][0]
            produced = written.get("artifacts", {}).get(key, {}).get("artifacts", [{}])[0]
            outputs[key] = {"name": declared["name"], "uri": produced.get("uri", declared["uri"]),
                            "metadata": produced.get("metadata", {})}
        return outputs

    def _exec(self, run: SpecRun, label: str, command: list[str], args: list[str], executor_input: dict,
              env: dict[str, str]) -> None:
        serialized = json.dumps(executor_input).replace(self.image_prefix, f"{self.checkout}/")
        argv = [serialized if a == "{{$}}" else a for a in [*command, *args]]
        pod = Path(tempfile.mkdtemp(prefix=f"pod-{label.split('.')[0]}-", dir=self.workdir))
        cwd, home = pod / "cwd", pod / "home"
        cwd.mkdir()
        home.mkdir()
        pod_env = {
            "PATH": f"{self.bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "PYTHONPATH": str(self.checkout),  # the image's installed code
            "TF_CPP_MIN_LOG_LEVEL": "2",
            **env,
        }
        done = subprocess.run(argv, cwd=cwd, env=pod_env, capture_output=True, text=True, timeout=self.timeout_s)
        run.logs[label] = done.stdout + done.stderr
        if done.returncode != 0:
            raise TaskFailed(f"task {label} exited with {done.returncode}:\n{run.logs[label][-4000:]}")
        left = sorted(p.name for p in cwd.iterdir())
        if left:
            raise TaskFailed(f"task {label} wrote into its working directory: {left}")
