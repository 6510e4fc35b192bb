"""infra/: the Dockerfile installs the lock as `make setup` does, and every Kubernetes manifest
parses and holds what its service needs (kinds, images, ports, commands, configs that parse)."""
from __future__ import annotations

import re
import shlex

import yaml

from tests.conftest import REPO

INFRA = REPO / "infra"
K8S = INFRA / "k8s"


def documents(name: str) -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    by_kind = {d["kind"]: d for d in docs}
    assert len(by_kind) == len(docs), f"{name}: one object per kind expected"
    return by_kind


def lock_version(package: str) -> str:
    match = re.search(rf"^{re.escape(package)}==(\S+)$", (REPO / "requirements.lock").read_text(), re.M)
    assert match, package
    return match.group(1)


def dockerfile_runs() -> list[str]:
    text = (INFRA / "Dockerfile").read_text().replace("\\\n", " ")
    return [line.strip()[4:] for line in text.splitlines() if line.strip().startswith("RUN ")]


def test_every_manifest_parses_with_its_kinds():
    kinds = {p.name: sorted(documents(p.name)) for p in K8S.glob("*.yaml")}
    assert kinds == {
        "loopline-config.yaml": ["ConfigMap"],
        "tfjob-train.yaml": ["TFJob"],
        "tf-serving.yaml": ["ConfigMap", "Deployment", "Service"],
        "mlflow-server.yaml": ["Deployment", "PersistentVolumeClaim", "Service"],
        "kserve-inferenceservice.yaml": ["InferenceService"],
    }


def test_dockerfile_installs_the_lock_like_make_setup():
    text = (INFRA / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11", text, re.M)
    assert re.search(r"^COPY requirements\.lock ", text, re.M)
    commands = [shlex.split(part) for run in dockerfile_runs() for part in run.split("&&")]
    lock_installs = [c for c in commands if "-r" in c and "requirements.lock" in c]
    assert lock_installs and all("--no-deps" in c and c[:4] == ["python", "-m", "pip", "install"] for c in lock_installs)
    # loopline itself: a real (not editable) install, so executors import from any folder.
    own = [c for c in commands if c[:4] == ["python", "-m", "pip", "install"] and "-r" not in c and "--no-deps" in c]
    assert own and "-e" not in own[0]
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


def test_tfjob_runs_loopline_train_on_two_workers_from_tf_config(tmp_path):
    job = documents("tfjob-train.yaml")["TFJob"]
    assert job["apiVersion"] == "kubeflow.org/v1"
    replicas = job["spec"]["tfReplicaSpecs"]
    assert list(replicas) == ["Worker"]
    worker = replicas["Worker"]
    assert worker["replicas"] == 2
    pod = worker["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "tensorflow"  # the container the operator gives TF_CONFIG
    assert container["image"] == "REGISTRY/loopline:TAG"
    assert "TF_CONFIG" not in {e["name"] for e in container.get("env", [])}  # the operator's job
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"tfjob-port": 2222}
    command = container["command"]
    assert command[:2] == ["loopline", "train"]
    assert command[command.index("--set") + 1] == "trainer.strategy=multi_worker"
    config_path = command[command.index("--config") + 1]
    (mount,) = container["volumeMounts"]
    assert config_path == f"{mount['mountPath']}/loopline.yaml"
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    configmap = documents("loopline-config.yaml")["ConfigMap"]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert "loopline.yaml" in configmap["data"]
    # The command's overrides are valid on the cluster config: multi_worker is a real strategy.
    from pipeline.cli import build_parser
    from pipeline.config import load_config

    args = build_parser().parse_args(command[1:])
    config_file = tmp_path / "loopline.yaml"
    config_file.write_text(configmap["data"]["loopline.yaml"])
    assert load_config(config_file, args.overrides).trainer.strategy == "multi_worker"


def test_cluster_config_is_valid_and_reachable_from_pods(tmp_path):
    from pipeline.config import load_config
    from pipeline.kubeflow_runner import check_paths_for_pods

    text = documents("loopline-config.yaml")["ConfigMap"]["data"]["loopline.yaml"]
    (tmp_path / "loopline.yaml").write_text(text)
    config = load_config(tmp_path / "loopline.yaml")
    assert check_paths_for_pods(config) == []  # remote root and data, a shared MLflow server
    mlflow = documents("mlflow-server.yaml")
    service = mlflow["Service"]
    assert config.mlflow.tracking_uri.startswith(f"http://{service['metadata']['name']}.")
    assert config.mlflow.tracking_uri.endswith(f":{service['spec']['ports'][0]['port']}")


def test_tf_serving_uses_the_real_image_ports_and_configs():
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    from serving.config_writer import MonitoringConfig  # the wheel lacks it; same field numbers

    docs = documents("tf-serving.yaml")
    files = docs["ConfigMap"]["data"]
    models = text_format.Parse(files["models.config"], model_server_config_pb2.ModelServerConfig())
    (model,) = models.model_config_list.config
    assert model.name == "penguins" and model.model_platform == "tensorflow"
    assert model.base_path.endswith("/serving/penguins")  # where the Pusher writes (pipeline.serving_base)
    monitoring = text_format.Parse(files["monitoring.config"], MonitoringConfig())
    assert monitoring.prometheus_config.enable

    pod = docs["Deployment"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    api = lock_version("tensorflow-serving-api")
    assert container["image"] == f"tensorflow/serving:{api}"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 8500, "rest": 8501}
    args = dict(a.removeprefix("--").split("=", 1) for a in container["args"])
    assert args["port"] == "8500" and args["rest_api_port"] == "8501"
    (mount,) = container["volumeMounts"]
    assert args["model_config_file"] == f"{mount['mountPath']}/models.config"
    assert args["monitoring_config_file"] == f"{mount['mountPath']}/monitoring.config"
    assert int(args["model_config_file_poll_wait_seconds"]) > 0  # label moves apply without a restart
    assert pod["metadata"]["annotations"]["prometheus.io/path"] == monitoring.prometheus_config.path
    (volume,) = pod["spec"]["volumes"]
    assert volume["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]

    service = docs["Service"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert {p["port"]: p["targetPort"] for p in service["spec"]["ports"]} == {8500: "grpc", 8501: "rest"}


def test_kserve_serves_the_same_folder():
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    service = documents("kserve-inferenceservice.yaml")["InferenceService"]
    model = service["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == "tensorflow"
    models = text_format.Parse(
        documents("tf-serving.yaml")["ConfigMap"]["data"]["models.config"], model_server_config_pb2.ModelServerConfig()
    )
    assert model["storageUri"] == models.model_config_list.config[0].base_path


def test_mlflow_server_runs_from_the_image():
    docs = documents("mlflow-server.yaml")
    (container,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "REGISTRY/loopline:TAG"
    assert container["command"][:2] == ["mlflow", "server"]
    args = dict(a.removeprefix("--").partition("=")[::2] for a in container["command"][2:])
    assert args["port"] == str(container["ports"][0]["containerPort"])
    service_host = f"{docs['Service']['metadata']['name']}.loopline.svc.cluster.local:{args['port']}"
    assert service_host in args["allowed-hosts"].split(",")
    (mount,) = container["volumeMounts"]
    assert args["backend-store-uri"].startswith(f"sqlite:///{mount['mountPath']}/")
