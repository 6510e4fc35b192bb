"""`loopline compile --target kubeflow`: the KFP v2 spec holds every component of the pipeline as a
task, in the pipeline's order, each running in the given image, with the pipeline root, MLflow
location and Beam args where the pods read them."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib

import pytest
import yaml

from tests.conftest import REPO, make_config, subprocess_env

IMAGE = "registry.example.com/ml/loopline:1.2.3"
ROOT = "gs://loopline-test-bucket/penguins"
DATA = "gs://loopline-test-bucket/data/penguins.csv"
MLFLOW = "https://mlflow.example.com"
BEAM = '["--runner=DataflowRunner","--project=p","--region=europe-west4"]'


def remote_config(tmp_path, *overrides):
    return make_config(
        tmp_path, f"pipeline.root={ROOT}", f"data.path={DATA}", f"mlflow.tracking_uri={MLFLOW}",
        f"pipeline.beam_args={BEAM}", "pipeline.enable_cache=false", *overrides,
    )


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """(config, the TFX pipeline, the PipelineJob JSON) for a remote configuration."""
    from pipeline.kubeflow_runner import compile_kubeflow
    from pipeline.pipeline import create_pipeline

    tmp = tmp_path_factory.mktemp("kfp")
    config = remote_config(tmp)
    result = compile_kubeflow(config, IMAGE, tmp / "pipeline.json")
    job = json.loads((tmp / "pipeline.json").read_text())
    assert result.warnings == []
    return config, create_pipeline(config, local_metadata=False), job, result


def test_repo_module_file_points_into_the_image(compiled):
    config, _, job, _ = compiled
    assert config.trainer.module_file == str(REPO / "examples" / "penguins" / "model.py")
    trainer_params = json.dumps(job["pipelineSpec"]["root"]["dag"]["tasks"]["Trainer"])
    assert "/opt/loopline/examples/penguins/model.py" in trainer_params
    assert str(REPO) not in trainer_params


def test_every_component_is_a_task_in_the_image(compiled):
    _, pipeline, job, result = compiled
    spec = job["pipelineSpec"]
    tasks = spec["root"]["dag"]["tasks"]
    ids = [c.id for c in pipeline.components]
    assert set(ids) <= set(tasks)
    assert result.tasks == ids
    executors = spec["deploymentSpec"]["executors"]
    for task_id in ids:
        executor = spec["components"][tasks[task_id]["componentRef"]["name"]]["executorLabel"]
        container = executors[executor]["container"]
        assert container["image"] == IMAGE, task_id
        assert container["command"][:3] == ["python", "-m", "tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor"]


def test_executor_classes_are_installed_by_the_image(compiled):
    """Each executor class lives in tfx or in a loopline package that the image installs."""
    _, _, job, _ = compiled
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    installed = {"tfx", *(p.rstrip("*") for p in packages)}
    for name, executor in job["pipelineSpec"]["deploymentSpec"]["executors"].items():
        args = executor["container"]["args"]
        class_path = args[args.index("--executor_class_path") + 1]
        assert class_path.split(".")[0] in installed, (name, class_path)
    trainer = job["pipelineSpec"]["deploymentSpec"]["executors"]["Trainer_executor"]["container"]["args"]
    assert trainer[trainer.index("--executor_class_path") + 1].startswith("components.trainer.")


def test_dependencies_follow_the_pipeline(compiled):
    _, pipeline, job, _ = compiled
    tasks = job["pipelineSpec"]["root"]["dag"]["tasks"]
    for component in pipeline.components:
        upstream = {node.id for node in component.upstream_nodes}
        assert upstream <= set(tasks[component.id].get("dependentTasks", [])), component.id
    assert "dependentTasks" not in tasks["CsvExampleGen"]
    assert "CsvExampleGen" in tasks["Trainer"]["dependentTasks"]
    trainer_model = tasks["Pusher"]["inputs"]["artifacts"]["model"]["taskOutputArtifact"]
    assert trainer_model["producerTask"] == "Trainer"


def test_root_data_mlflow_and_beam_args_reach_the_pods(compiled):
    _, _, job, result = compiled
    spec = job["pipelineSpec"]
    assert job["runtimeConfig"]["gcsOutputDirectory"] == f"{ROOT}/tfx"
    assert spec["defaultPipelineRoot"] == f"{ROOT}/tfx"
    assert result.pipeline_root == f"{ROOT}/tfx"
    assert spec["schemaVersion"] == "2.1.0"
    tasks = spec["root"]["dag"]["tasks"]

    def constant(task, name):
        return tasks[task]["inputs"]["parameters"][name]["runtimeValue"]["constant"]

    assert constant("CsvExampleGen", "input_base") == "gs://loopline-test-bucket/data"
    assert json.loads(constant("Pusher", "push_destination"))["filesystem"]["base_directory"] == f"{ROOT}/serving/penguins"
    for name, executor in spec["deploymentSpec"]["executors"].items():
        env = {e["name"]: e["value"] for e in executor["container"]["env"]}
        assert env["MLFLOW_TRACKING_URI"] == MLFLOW, name
        assert env["MLFLOW_EXPERIMENT_NAME"] == "loopline", name
        assert env["OPENBLAS_THREAD_TIMEOUT"] == "4", name  # TFX's entry point there, not our CLI
    example_gen = spec["deploymentSpec"]["executors"]["CsvExampleGen_executor"]["container"]
    for arg in json.loads(BEAM):
        assert arg in example_gen["args"]


def test_data_baseline_lives_under_the_root_the_pods_share(compiled):
    """No ML Metadata in the pods: the baseline is files under pipeline.root, written after the
    Pusher and read by SchemaGen and ExampleValidator; the Evaluator sees accepted changes."""
    _, _, job, _ = compiled
    tasks = job["pipelineSpec"]["root"]["dag"]["tasks"]
    for task in ("SchemaGen", "ExampleValidator", "BaselineRecorder"):
        assert tasks[task]["inputs"]["parameters"]["baseline_dir"]["runtimeValue"]["constant"] == f"{ROOT}/baseline/penguins"
    assert "Pusher" in tasks["BaselineRecorder"]["dependentTasks"]
    assert tasks["Evaluator"]["inputs"]["artifacts"]["anomalies"]["taskOutputArtifact"]["producerTask"] == "ExampleValidator"


def test_json_is_a_pipeline_job_and_yaml_a_pipeline_spec(compiled, tmp_path):
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2

    from pipeline.kubeflow_runner import compile_kubeflow

    config, _, job, _ = compiled
    json_format.ParseDict(job, pipeline_spec_pb2.PipelineJob())  # Vertex AI Pipelines' format
    compile_kubeflow(config, IMAGE, tmp_path / "pipeline.yaml")
    docs = list(yaml.safe_load_all((tmp_path / "pipeline.yaml").read_text()))
    assert len(docs) == 1
    spec = json_format.ParseDict(docs[0], pipeline_spec_pb2.PipelineSpec())  # what kfp.Client uploads
    assert spec.default_pipeline_root == f"{ROOT}/tfx"
    assert set(spec.root.dag.tasks) == set(job["pipelineSpec"]["root"]["dag"]["tasks"])
    assert {e["container"]["image"] for e in docs[0]["deploymentSpec"]["executors"].values()} == {IMAGE}


@pytest.mark.parametrize("key, override", [("pipeline.root", "pipeline.root=workspace"), ("data.path", "data.path=/srv/penguins.csv")])
def test_local_paths_are_refused_naming_the_key(tmp_path, key, override):
    from pipeline.config import ConfigError
    from pipeline.kubeflow_runner import compile_kubeflow

    config = remote_config(tmp_path, override)
    with pytest.raises(ConfigError, match=rf"^{key}: .*pods cannot see.*--allow-local-paths"):
        compile_kubeflow(config, IMAGE, tmp_path / "p.json")
    assert not (tmp_path / "p.json").exists()


def test_mounted_volume_paths_compile_with_warnings(tmp_path):
    from pipeline.kubeflow_runner import compile_kubeflow

    config = make_config(tmp_path / "mnt")
    result = compile_kubeflow(config, IMAGE, tmp_path / "p.json", allow_local_paths=True)
    assert any(w.startswith("pipeline.root:") for w in result.warnings)
    assert any(w.startswith("data.path:") for w in result.warnings)
    assert any(w.startswith("mlflow.tracking_uri:") for w in result.warnings)
    assert any(w.startswith("pipeline.enable_cache:") for w in result.warnings)  # the default is on
    job = json.loads((tmp_path / "p.json").read_text())
    assert job["runtimeConfig"]["gcsOutputDirectory"] == str(tmp_path / "mnt" / "tfx")
    assert not (tmp_path / "mnt" / "metadata.sqlite").exists()  # Kubeflow keeps ML Metadata


def test_bad_image_and_output_are_refused(tmp_path):
    from pipeline.config import ConfigError
    from pipeline.kubeflow_runner import compile_kubeflow

    config = remote_config(tmp_path)
    with pytest.raises(ConfigError, match="--image"):
        compile_kubeflow(config, "not an image", tmp_path / "p.json")
    with pytest.raises(ConfigError, match="--output"):
        compile_kubeflow(config, IMAGE, tmp_path / "p.txt")


def test_cli_compile(tmp_path):
    out = tmp_path / "spec" / "penguins.yaml"
    base = [sys.executable, "-m", "pipeline.cli", "compile", "--config", str(REPO / "loopline.yaml")]
    ok = subprocess.run(
        [*base, "--target", "kubeflow", "--image", IMAGE, "--output", str(out),
         "--set", f"pipeline.root={ROOT}", "--set", f"data.path={DATA}", "--set", f"mlflow.tracking_uri={MLFLOW}"],
        env=subprocess_env(), capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )
    assert ok.returncode == 0, ok.stderr
    assert f"wrote      {out}" in ok.stdout
    assert not re.search(r"^I\d{4} |absl::InitializeLog", ok.stderr, re.M), ok.stderr  # TensorFlow's start-up lines
    said = ok.stdout + ok.stderr
    assert said.count("pipeline.enable_cache:") == 1 and "warning    pipeline.enable_cache:" in ok.stdout, said  # once
    tasks = next(line for line in ok.stdout.splitlines() if line.startswith("tasks "))
    listed = tasks.split(None, 1)[1].split(", ")
    assert listed[0] == "CsvExampleGen" and {"Trainer", "Pusher"} <= set(listed)
    assert yaml.safe_load(out.read_text())["deploymentSpec"]["executors"]["Trainer_executor"]["container"]["image"] == IMAGE

    refused = subprocess.run(
        [*base, "--target", "kubeflow", "--image", IMAGE, "--output", str(tmp_path / "x.json")],
        env=subprocess_env(), capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )
    assert refused.returncode == 2
    assert "loopline: error: pipeline.root:" in refused.stderr
    assert not (tmp_path / "x.json").exists()


def test_spec_holds_no_path_of_the_compiling_machine(tmp_path):
    """Only the remote root, the image's paths and the server's URL: no checkout, no local
    ML Metadata file, no embedded MLflow store."""
    from pipeline.kubeflow_runner import RUN_ID_PLACEHOLDER, compile_kubeflow

    config = remote_config(tmp_path, f"pipeline.metadata_path={tmp_path / 'md.sqlite'}")
    compile_kubeflow(config, IMAGE, tmp_path / "out" / "pipeline.json")
    text = (tmp_path / "out" / "pipeline.json").read_text()
    for local in (str(REPO), str(tmp_path), "sqlite", "metadata.sqlite"):
        assert local not in text, local
    tasks = json.loads(text)["pipelineSpec"]["root"]["dag"]["tasks"]
    run_id = tasks["Registrar"]["inputs"]["parameters"]["pipeline_run_id"]["runtimeValue"]["constant"]
    assert run_id == RUN_ID_PLACEHOLDER == "{{$.pipeline_job_uuid}}"  # KFP substitutes the run's id
    assert "ServingConfigs" in tasks


def test_remote_root_needs_a_tracking_server(tmp_path):
    from pipeline.config import ConfigError
    from pipeline.kubeflow_runner import compile_kubeflow

    config = make_config(tmp_path, f"pipeline.root={ROOT}", f"data.path={DATA}")
    with pytest.raises(ConfigError, match=r"mlflow\.tracking_uri is required when pipeline\.root is remote"):
        compile_kubeflow(config, IMAGE, tmp_path / "pipeline.json")
    assert not (tmp_path / "pipeline.json").exists()


@pytest.mark.parametrize("key, value", [("pipeline.root", "s3://bucket/root"), ("data.path", "hdfs://nn:8020/d.csv")])
def test_s3_and_hdfs_are_refused_by_compile_and_run(tmp_path, key, value):
    """tensorflow-io, which TensorFlow needs for them, does not load with TensorFlow 2.21."""
    for command in (["compile", "--target", "kubeflow", "--image", IMAGE, "--output", str(tmp_path / "p.json")],
                    ["run"]):
        done = subprocess.run([sys.executable, "-m", "pipeline.cli", *command, "--config", str(REPO / "loopline.yaml"),
                               "--set", f"{key}={value}", "--set", f"mlflow.tracking_uri={MLFLOW}"],
                              cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 2
        scheme = value.split("://")[0]
        assert done.stderr.strip().startswith(f"loopline: error: {key}: '{value}': the {scheme}:// filesystem is not supported")
        assert "tensorflow-io" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "p.json").exists()


def test_eval_path_keeps_the_bucket_scheme(tmp_path):
    """ExampleGen's input base is the folder above both files, as a URI (os.path.commonpath would
    fold gs://b into gs:/b)."""
    from pipeline.pipeline import create_pipeline

    config = remote_config(tmp_path, "data.eval_path=gs://loopline-test-bucket/data/eval/penguins.csv")
    example_gen = create_pipeline(config, local_metadata=False).components[0]
    assert example_gen.exec_properties["input_base"] == "gs://loopline-test-bucket/data"
    splits = json.loads(example_gen.exec_properties["input_config"])["splits"]
    assert [(s["name"], s["pattern"]) for s in splits] == [("train", "penguins.csv"), ("eval", "eval/penguins.csv")]


SEARCH_SPACE = "tuner.search_space={learning_rate: {min: 0.001, max: 0.03, sampling: log}, hparams.units: {values: [16, 64]}}"


def test_the_tuner_is_a_step_of_its_own(tmp_path):
    """tuner.enabled adds a Tuner task in the image, after the data gate; the Trainer takes its
    best_hyperparameters; a tuner.module_file from examples/ points into the image."""
    from pipeline.kubeflow_runner import compile_kubeflow

    config = remote_config(tmp_path, "tuner.enabled=true", SEARCH_SPACE)
    result = compile_kubeflow(config, IMAGE, tmp_path / "pipeline.json")
    spec = json.loads((tmp_path / "pipeline.json").read_text())["pipelineSpec"]
    tasks = spec["root"]["dag"]["tasks"]
    assert result.tasks.index("DataGate") < result.tasks.index("Tuner") < result.tasks.index("Trainer")
    assert "DataGate" in tasks["Tuner"]["dependentTasks"] and "Tuner" in tasks["Trainer"]["dependentTasks"]
    source = tasks["Trainer"]["inputs"]["artifacts"]["hyperparameters"]["taskOutputArtifact"]
    assert source == {"producerTask": "Tuner", "outputArtifactKey": "best_hyperparameters"}
    executor = spec["deploymentSpec"]["executors"]["Tuner_executor"]["container"]
    assert executor["image"] == IMAGE
    assert executor["args"][executor["args"].index("--executor_class_path") + 1].startswith("components.tuner.")
    tuner_config = json.loads(tasks["Tuner"]["inputs"]["parameters"]["tuner_config"]["runtimeValue"]["constant"])
    assert tuner_config["search_space"]["hparams.units"] == {"values": [16, 64]}

    # (a tuner_fn is looked for where the file is: in the image)
    with_module = remote_config(tmp_path, f"tuner.module_file={REPO / 'examples' / 'penguins' / 'model.py'}")
    compile_kubeflow(with_module, IMAGE, tmp_path / "module.json")
    tasks = json.loads((tmp_path / "module.json").read_text())["pipelineSpec"]["root"]["dag"]["tasks"]
    tuner_config = json.loads(tasks["Tuner"]["inputs"]["parameters"]["tuner_config"]["runtimeValue"]["constant"])
    assert tuner_config["module_file"] == "/opt/loopline/examples/penguins/model.py"


def test_a_transform_step_is_compiled_with_its_module_file_named_for_the_image(tmp_path):
    """transform.module_file makes a Transform task before the Trainer, which takes its graph and
    examples; a module outside the image's examples/ is named in the warnings, as the trainer's is."""
    from pipeline.kubeflow_runner import compile_kubeflow

    module = REPO / "tests" / "data" / "tfx_penguin" / "penguin_utils_keras.py"
    config = remote_config(tmp_path, f"transform.module_file={module}", f"trainer.module_file={module}")
    result = compile_kubeflow(config, IMAGE, tmp_path / "pipeline.json")
    tasks = json.loads((tmp_path / "pipeline.json").read_text())["pipelineSpec"]["root"]["dag"]["tasks"]
    assert result.tasks.index("Transform") < result.tasks.index("Trainer")
    assert tasks["Trainer"]["inputs"]["artifacts"]["transform_graph"]["taskOutputArtifact"]["producerTask"] == "Transform"
    assert any(w.startswith(f"transform.module_file: {module} must exist at that path in the image")
               for w in result.warnings), result.warnings
