"""Version lifecycle in an embedded server (in process, free ports): the warmup file is replayed
when a version loads (counted in the log and in Prometheus), a version whose warmup fails is
refused while the previous one keeps serving, and HandleReloadConfigRequest adds a model and moves
a label."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving.config import ServingConfig
from serving.config_writer import model_entry, write_serving_configs
from serving.server import ModelServer
from tests.serving_helpers import add_version, example, export_model, wait_for
from trainer.warmup import WARMUP_FILE, examples_log, predict_log, write_warmup

AVAILABLE, END = get_model_status_pb2.ModelVersionStatus.AVAILABLE, get_model_status_pb2.ModelVersionStatus.END


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    base = tmp_path_factory.mktemp("exports")
    out = {"a": export_model(base / "a", seed=0), "b": export_model(base / "b", seed=1),
           "mass": export_model(base / "mass", "regression")}
    serialized = [example().SerializeToString(), example(50, 220, "Biscoe").SerializeToString()]
    for path in out.values():
        write_warmup(str(path), serialized)  # one Classify/Regress record, one Predict record
    write_warmup(str(out["mass"]), serialized, default_method="tensorflow/serving/regress")
    return out


@pytest.fixture
def server(tmp_path, exports):
    root = tmp_path / "serving"
    add_version(root / "penguins", exports["a"], 1)
    write_serving_configs(str(root), ServingConfig())
    server = ModelServer(str(root), ServingConfig(grpc_port=0, rest_port=0, poll_seconds=0.2)).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    server.stubs = (prediction_service_pb2_grpc.PredictionServiceStub(channel), model_service_pb2_grpc.ModelServiceStub(channel))
    try:
        yield server
    finally:
        channel.close()
        server.stop(grace=0)


def scores(stub, **spec) -> tuple[int, np.ndarray]:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = spec.pop("name", "penguins")
    request.model_spec.signature_name = "predict"
    for key, value in spec.items():
        if key == "version":
            request.model_spec.version.value = value
        else:
            setattr(request.model_spec, key, value)
    request.inputs["inputs"].CopyFrom(tf.make_tensor_proto([example().SerializeToString()]))
    response = stub.Predict(request, timeout=30)
    key = "species_scores" if "species_scores" in response.outputs else "body_mass_g_outputs"
    return response.model_spec.version.value, tf.make_ndarray(response.outputs[key])


def base(server, name: str) -> Path:
    return Path(server.manager.serving_root) / name


def metrics(server) -> str:
    return requests.get(f"http://127.0.0.1:{server.rest_port}/monitoring/prometheus/metrics", timeout=30).text


def versions(model_stub, name="penguins") -> dict[int, tuple[int, str]]:
    status = model_stub.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(model_spec={"name": name}), timeout=30)
    return {s.version: (s.state, s.status.error_message) for s in status.model_version_status}


def test_warmup_is_replayed_and_counted(server, exports, caplog):
    stub, _ = server.stubs
    assert 'loopline_warmup_requests_total{model="penguins",version="1"} 2' in metrics(server)
    assert 'loopline_warmups_total{model="penguins",code="OK"} 1' in metrics(server)
    with caplog.at_level(logging.INFO, logger="loopline.serving"):
        add_version(base(server, "penguins"), exports["b"], 2)
        wait_for(lambda: scores(stub)[0] == 2, 60, "version 2 to serve")
    assert "model penguins version 2: replayed 2 warmup requests" in caplog.text
    assert 'loopline_warmup_requests_total{model="penguins",version="2"} 2' in metrics(server)


def test_a_version_whose_warmup_fails_is_refused_and_the_previous_keeps_serving(server, exports, tmp_path, caplog):
    stub, model_stub = server.stubs
    before = scores(stub)
    broken = tmp_path / "broken"
    shutil.copytree(exports["b"], broken)
    # A Predict record on a signature the model does not have, after one that works.
    with tf.io.TFRecordWriter(str(broken / "assets.extra" / WARMUP_FILE)) as writer:
        writer.write(examples_log("tensorflow/serving/classify", "serving_default", [example().SerializeToString()]).SerializeToString())
        writer.write(predict_log("nope", {"inputs": np.array([example().SerializeToString()], dtype=object)}).SerializeToString())
    with caplog.at_level(logging.ERROR, logger="loopline.serving"):
        add_version(base(server, "penguins"), broken, 3)
        wait_for(lambda: 3 in versions(model_stub), 60, "version 3 to be refused")
    state, reason = versions(model_stub)[3]
    assert state == END and reason.startswith("warmup failed: warmup record 1 (predict_log)")
    assert 'Serving signature key "nope" not found.' in reason
    status = model_stub.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(
        model_spec={"name": "penguins", "version": {"value": 3}}), timeout=30)
    assert status.model_version_status[0].status.error_code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert "model penguins version 3 refused, previous versions keep serving" in caplog.text
    assert versions(model_stub)[1][0] == AVAILABLE
    after = scores(stub)
    assert after[0] == 1 and np.allclose(after[1], before[1])
    assert 'loopline_warmups_total{model="penguins",code="FAILED_PRECONDITION"} 1' in metrics(server)


def test_reload_config_adds_a_model_and_moves_a_label(server, exports):
    stub, model_stub = server.stubs
    root = server.manager.serving_root
    add_version(base(server, "penguins"), exports["b"], 2)
    add_version(base(server, "mass"), exports["mass"], 1)
    penguins = model_entry(root, "penguins")
    penguins.model_version_policy.Clear()
    penguins.model_version_policy.specific.versions.extend([1, 2])
    penguins.version_labels["stable"] = 1
    config = model_management_pb2.ReloadConfigRequest()
    config.config.model_config_list.config.append(penguins)
    response = model_stub.HandleReloadConfigRequest(config, timeout=60)
    assert response.status.error_code == 0
    assert scores(stub, version_label="stable")[0] == 1
    with pytest.raises(grpc.RpcError) as info:  # not served yet
        scores(stub, name="mass")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND

    # One reload: a second model, and `stable` moved to version 2.
    config.config.model_config_list.config[0].version_labels["stable"] = 2
    config.config.model_config_list.config.append(model_entry(root, "mass"))
    assert model_stub.HandleReloadConfigRequest(config, timeout=60).status.error_code == 0
    version, moved = scores(stub, version_label="stable")
    assert version == 2 and np.allclose(moved, scores(stub, version=2)[1]) and not np.allclose(moved, scores(stub, version=1)[1])
    assert versions(model_stub, "mass") == {1: (AVAILABLE, "")}
    mass_version, mass = scores(stub, name="mass")
    expected = tf.saved_model.load(str(exports["mass"])).signatures["predict"](
        inputs=tf.constant([example().SerializeToString()]))["body_mass_g_outputs"].numpy()
    assert mass_version == 1 and np.allclose(mass, expected, rtol=1e-5)
