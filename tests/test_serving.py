"""A real `loopline serve` process on 127.0.0.1, driven by the stock tensorflow_serving.apis stubs
and over REST: status, metadata, Predict/Classify/Regress/MultiInference, error codes, labels,
a hot swap under 16 clients, a corrupt version, `loopline predict`. Malformed requests of every
kind: tests/test_fuzz_serving.py."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)
from tensorflow_serving.config import model_server_config_pb2

from serving.config import ServingConfig
from serving.config_writer import write_serving_configs
from serving.model_config import set_version_labels
from tests.conftest import REPO, subprocess_env
from tests.serving_helpers import ServerProcess, add_version, example, export_model, wait_for

MODELS = ("penguins", "mass", "swap", "guarded")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("exports")
    return {
        "a": export_model(base / "a", seed=0),
        "b": export_model(base / "b", seed=1),
        "mass": export_model(base / "mass", "regression"),
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory, exported):
    workspace = tmp_path_factory.mktemp("workspace")
    root = workspace / "serving"
    for name in MODELS:
        add_version(root / name, exported["mass" if name == "mass" else "a"], 1)
        write_serving_configs(str(root), ServingConfig(model_name=name))
    server = ServerProcess(workspace)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(server.grpc_target)
    yield prediction_service_pb2_grpc.PredictionServiceStub(channel)
    channel.close()


@pytest.fixture(scope="module")
def model_stub(server):
    channel = grpc.insecure_channel(server.grpc_target)
    yield model_service_pb2_grpc.ModelServiceStub(channel)
    channel.close()


def raw_request(model="penguins", bill=40.0, island=b"Dream", **spec):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = "predict_raw"
    for key, value in spec.items():
        if key == "version":
            request.model_spec.version.value = value
        else:
            setattr(request.model_spec, key, value)
    request.inputs["bill_length_mm"].CopyFrom(tf.make_tensor_proto([[bill]], None if isinstance(bill, str) else tf.float32))
    request.inputs["flipper_length_mm"].CopyFrom(tf.make_tensor_proto([[190.0]], tf.float32))
    request.inputs["island"].CopyFrom(tf.make_tensor_proto([[island]]))
    return request


def scores(response) -> np.ndarray:
    return tf.make_ndarray(response.outputs["scores"])


def in_process(path, signature, **inputs):
    loaded = tf.saved_model.load(str(path))
    return {k: v.numpy() for k, v in loaded.signatures[signature](**inputs).items()}


def rpc_code(call, *args) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=10)
    return info.value.code(), info.value.details()


def test_served_through_a_session_without_onednn(server):
    """`loopline serve` turns oneDNN off before TensorFlow loads (TF announces it when on) and
    calls the signatures through a Session, as TF Serving does. The terminal shows one line per
    loaded version; TensorFlow's C++ lines are in the command's log only."""
    terminal, log = server.log(), server.command_log()
    assert set(re.findall(r"^model (\S+) version 1 loaded and serving .*signatures called through session\)$",
                          terminal, re.M)) == set(MODELS)
    assert re.search(r"^[IWE]\d{4} ", log, re.M) and not re.search(r"^[IWE]\d{4} ", terminal, re.M)
    assert "oneDNN custom operations are on" not in log


def test_server_pinned_to_cpus(tmp_path):
    """serving.cpus is set before TensorFlow and gRPC start their threads: every thread has it."""
    (tmp_path / "serving").mkdir()
    cpu = min(os.sched_getaffinity(0))
    pinned = ServerProcess(tmp_path, f"serving.cpus=[{cpu}]")
    try:
        allowed = set()
        server = Path(f"/proc/{pinned.proc.pid}/task/{pinned.proc.pid}/children").read_text().split()  # supervised
        assert server
        for status in [s for pid in (pinned.proc.pid, *server) for s in Path(f"/proc/{pid}/task").glob("*/status")]:
            allowed |= {line.split()[1] for line in status.read_text().splitlines() if line.startswith("Cpus_allowed_list")}
        assert allowed == {str(cpu)}
    finally:
        pinned.stop()


def test_status_and_metadata(stub, model_stub):
    status = model_stub.GetModelStatus(
        get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "penguins"}), timeout=10)
    assert [(s.version, s.state) for s in status.model_version_status] == [(1, get_model_status_pb2.ModelVersionStatus.AVAILABLE)]

    request = get_model_metadata_pb2.GetModelMetadataRequest(model_spec={"name": "penguins"}, metadata_field=["signature_def"])
    response = stub.GetModelMetadata(request, timeout=10)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(signatures)
    assert set(signatures.signature_def) - {"__saved_model_init_op"} == {
        "serving_default", "classify_species", "regress_body_mass_g", "predict", "predict_raw"}
    assert set(signatures.signature_def["predict_raw"].inputs) == {"bill_length_mm", "flipper_length_mm", "island"}
    default = signatures.signature_def["serving_default"]
    assert (set(default.outputs), default.method_name) == ({"classes", "scores"}, "tensorflow/serving/classify")
    assert set(signatures.signature_def["predict"].outputs) == {"species_classes", "species_scores", "body_mass_g_outputs"}


def test_predict_matches_the_saved_model(stub, exported):
    served = stub.Predict(raw_request(), timeout=10)
    expected = in_process(exported["a"], "predict_raw", bill_length_mm=tf.constant([[40.0]]),
                          flipper_length_mm=tf.constant([[190.0]]), island=tf.constant([[b"Dream"]]))
    np.testing.assert_allclose(scores(served), expected["scores"], rtol=1e-6)
    assert served.model_spec.version.value == 1

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "penguins"
    request.inputs["inputs"].CopyFrom(tf.make_tensor_proto([example().SerializeToString(), example(50, 220, "Biscoe").SerializeToString()]))
    request.output_filter.append("scores")
    served = stub.Predict(request, timeout=10)
    assert list(served.outputs) == ["scores"]
    expected = in_process(exported["a"], "serving_default", inputs=tf.constant([example().SerializeToString(),
                                                                                  example(50, 220, "Biscoe").SerializeToString()]))
    np.testing.assert_allclose(scores(served), expected["scores"], rtol=1e-6)


def test_classify_regress_multi_inference(stub, exported):
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "penguins"
    request.input.example_list.examples.extend([example(), example(50, 220, "Biscoe")])
    result = stub.Classify(request, timeout=10).result
    expected = in_process(exported["a"], "serving_default", inputs=tf.constant([example().SerializeToString(),
                                                                                  example(50, 220, "Biscoe").SerializeToString()]))
    assert [c.label for c in result.classifications[0].classes] == ["Adelie", "Chinstrap", "Gentoo"]
    np.testing.assert_allclose([[c.score for c in item.classes] for item in result.classifications], expected["scores"], rtol=1e-6)

    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name = "mass"
    context = regress.input.example_list_with_context
    context.context.features.feature["island"].bytes_list.value.append(b"Dream")
    one = example()
    del one.features.feature["island"]
    context.examples.append(one)
    values = [r.value for r in stub.Regress(regress, timeout=10).result.regressions]
    expected = in_process(exported["mass"], "serving_default", inputs=tf.constant([example().SerializeToString()]))
    np.testing.assert_allclose(values, expected["outputs"].reshape(-1), rtol=1e-5)

    multi = inference_pb2.MultiInferenceRequest()
    multi.input.example_list.examples.append(example())
    multi.tasks.add(model_spec={"name": "mass"}, method_name="tensorflow/serving/regress")
    response = stub.MultiInference(multi, timeout=10)
    assert response.results[0].regression_result.regressions[0].value == pytest.approx(values[0], rel=1e-5)

    regress.model_spec.name = "penguins"  # serving_default is a classify signature: two outputs
    code, details = rpc_code(stub.Regress, regress)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details == "Expected one output Tensor."
    regress.model_spec.signature_name = "regress_body_mass_g"  # the second head's own signature
    penguin_mass = [r.value for r in stub.Regress(regress, timeout=10).result.regressions]
    expected = in_process(exported["a"], "predict", inputs=tf.constant([example().SerializeToString()]))
    np.testing.assert_allclose(penguin_mass, expected["body_mass_g_outputs"].reshape(-1), rtol=1e-5)


def test_errors_have_tf_serving_codes(stub, server):
    not_found = grpc.StatusCode.NOT_FOUND
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert rpc_code(stub.Predict, raw_request(model="nope"))[0] == not_found
    assert rpc_code(stub.Predict, raw_request(version=9))[0] == not_found
    assert rpc_code(stub.Predict, raw_request(version_label="nope"))[0] == invalid  # TF Serving's code

    # A wrong dtype: the Session's own check and text (FunctionCallFrame::SetArgs; feeds by name).
    code, details = rpc_code(stub.Predict, raw_request(bill="forty"))
    assert (code, details) == (invalid, "Expects arg[0] to be float but string is provided")
    request = raw_request()
    del request.inputs["island"]
    code, details = rpc_code(stub.Predict, request)
    assert code == invalid and "Missing but required: {island}" in details
    # loopline's start mode checks the signature's TensorSpec before the run (TF Serving, and
    # loopline under its flags, leave it to the model's ops): a [1] string where [-1, 1] is declared.
    request = raw_request()
    request.inputs["island"].CopyFrom(tf.make_tensor_proto([b"Dream"]))
    assert rpc_code(stub.Predict, request) == (invalid, "input 'island': shape [1] does not match the signature's "
                                                        "[-1,1] (-1: any size)")
    code, details = rpc_code(stub.Predict, raw_request(signature_name="nope"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "nope" in details

    big = raw_request()
    big.inputs["island"].CopyFrom(tf.make_tensor_proto([[b"x" * (17 * 1024 * 1024)]]))
    assert rpc_code(stub.Predict, big)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED

    # Garbage bytes instead of a PredictRequest.
    channel = grpc.insecure_channel(server.grpc_target)
    raw = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
    with pytest.raises(grpc.RpcError) as info:
        raw(b"\xff\x00garbage\x12\x99", timeout=10)
    assert info.value.code() == invalid  # the client's bytes: never INTERNAL
    channel.close()
    assert np.isfinite(scores(stub.Predict(raw_request(), timeout=10))).all()  # still serving


def test_rest_matches_grpc(stub, server):
    grpc_scores = scores(stub.Predict(raw_request(), timeout=10))
    url = f"{server.rest_url}/v1/models/penguins"
    row = requests.post(f"{url}:predict", timeout=10, json={
        "signature_name": "predict_raw",
        "instances": [{"bill_length_mm": [40.0], "flipper_length_mm": [190.0], "island": ["Dream"]}]}).json()
    np.testing.assert_allclose(row["predictions"][0]["scores"], grpc_scores[0], rtol=1e-6)
    assert row["predictions"][0]["classes"] == ["Adelie", "Chinstrap", "Gentoo"]
    columnar = requests.post(f"{url}/versions/1:predict", timeout=10, json={
        "signature_name": "predict_raw",
        "inputs": {"bill_length_mm": [[40.0]], "flipper_length_mm": [[190.0]], "island": [["Dream"]]}}).json()
    np.testing.assert_allclose(columnar["outputs"]["scores"], grpc_scores, rtol=1e-6)
    classify = requests.post(f"{url}:classify", timeout=10, json={
        "examples": [{"bill_length_mm": 40.0, "flipper_length_mm": 190, "island": "Dream"}]}).json()
    np.testing.assert_allclose([score for _, score in classify["results"][0]], grpc_scores[0], rtol=1e-6)
    regress = requests.post(f"{server.rest_url}/v1/models/mass:regress", timeout=10, json={
        "examples": [{"bill_length_mm": 40.0, "flipper_length_mm": 190, "island": "Dream"}]}).json()
    assert isinstance(regress["results"][0], float)

    assert requests.get(url, timeout=10).json()["model_version_status"] == [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]
    assert "predict_raw" in requests.get(f"{url}/metadata", timeout=10).json()["metadata"]["signature_def"]["signature_def"]
    missing = requests.post(f"{server.rest_url}/v1/models/nope:predict", json={"instances": [1]}, timeout=10)
    assert missing.status_code == 404 and "nope" in missing.json()["error"]
    bad = requests.post(f"{url}:predict", data="{not json", timeout=10)
    assert bad.status_code == 400 and bad.json()["error"].startswith("JSON Parse error")
    wrong = requests.post(f"{url}:predict", timeout=10, json={
        "signature_name": "predict_raw", "inputs": {"bill_length_mm": [["x"]], "flipper_length_mm": [[1.0]], "island": [["a"]]}})
    assert wrong.status_code == 400 and "is not of expected type: float" in wrong.json()["error"]
    huge = requests.post(f"{url}:predict", data=b"x" * (17 * 1024 * 1024), timeout=30)
    assert huge.status_code == 413

    metrics = requests.get(f"{server.rest_url}/monitoring/prometheus/metrics", timeout=10).text
    assert 'loopline_requests_total{api="grpc",model="penguins",method="Predict",code="OK"}' in metrics
    assert 'loopline_request_errors_total{api="rest",model="nope",method="predict"} 1' in metrics
    assert "loopline_request_latency_seconds_bucket" in metrics


def _read_answer(reader) -> tuple[int, dict, bytes]:
    """One HTTP/1.1 answer from a socket's file: status, headers (lower-case names), body."""
    status = int(reader.readline().split()[1])
    headers = {}
    while (line := reader.readline().strip()):
        name, value = line.decode().split(":", 1)
        headers[name.lower()] = value.strip()
    return status, headers, reader.read(int(headers.get("content-length", 0)))


def test_rest_speaks_http_1_1_on_the_wire(stub, server):
    """What clients other than `requests` send: two requests in one write on a kept-alive
    connection (answered in order), a chunked body, and a line that is not HTTP (400, closed)."""
    import socket

    grpc_scores = scores(stub.Predict(raw_request(), timeout=10))
    body = json.dumps({"signature_name": "predict_raw", "instances": [
        {"bill_length_mm": [40.0], "flipper_length_mm": [190.0], "island": ["Dream"]}]}).encode()
    host = f"Host: 127.0.0.1:{server.rest_port}\r\n".encode()
    predict = b"POST /v1/models/penguins:predict HTTP/1.1\r\n" + host + b"Content-Length: %d\r\n\r\n" % len(body) + body
    status = b"GET /v1/models/penguins HTTP/1.1\r\n" + host + b"\r\n"
    chunked = (b"POST /v1/models/penguins:predict HTTP/1.1\r\n" + host + b"Transfer-Encoding: chunked\r\n\r\n"
               + b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:10], body[10:])) + b"0\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=10) as sock, sock.makefile("rb") as reader:
        sock.sendall(predict + status)
        first, second = _read_answer(reader), _read_answer(reader)
        assert first[0] == 200 and second[0] == 200
        np.testing.assert_allclose(json.loads(first[2])["predictions"][0]["scores"], grpc_scores[0], rtol=1e-6)
        assert json.loads(second[2])["model_version_status"][0]["state"] == "AVAILABLE"
        sock.sendall(chunked)
        code, _, answer = _read_answer(reader)
        assert code == 200
        np.testing.assert_allclose(json.loads(answer)["predictions"][0]["scores"], grpc_scores[0], rtol=1e-6)
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        rest = reader.read()  # returns once the server closes the connection
        assert rest.startswith(b"HTTP/1.1 400 ") and b"connection: close" in rest.lower()
    assert server.proc.poll() is None


def test_labels_follow_models_config(stub, server, exported):
    root = server.log_path.parent / "serving"
    add_version(root / "penguins", exported["b"], 2)
    wait_for(lambda: stub.Predict(raw_request(), timeout=10).model_spec.version.value == 2, 60, "version 2 to serve")
    set_version_labels(str(root / "models.config"), "penguins", {"stable": 1, "canary": 2})
    wait_for(lambda: _label_version(stub, "stable") == 1, 30, "label stable -> 1")
    assert _label_version(stub, "canary") == 2
    assert not np.allclose(scores(stub.Predict(raw_request(version_label="stable"), timeout=10)),
                           scores(stub.Predict(raw_request(version_label="canary"), timeout=10)))


def _label_version(stub, label):
    try:
        return stub.Predict(raw_request(version_label=label), timeout=10).model_spec.version.value
    except grpc.RpcError:
        return None


def test_hot_swap_under_16_clients_fails_no_request(stub, server, exported):
    root = server.log_path.parent / "serving"
    answers = {v: scores(stub.Predict(raw_request(model="swap"), timeout=10)) for v in (1,)}
    stop = threading.Event()
    results: list = []

    def client():
        channel = grpc.insecure_channel(server.grpc_target)
        own = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        while not stop.is_set():
            try:
                response = own.Predict(raw_request(model="swap"), timeout=20)
                results.append((response.model_spec.version.value, scores(response)))
            except grpc.RpcError as exc:
                results.append(("error", exc.code()))
        channel.close()

    threads = [threading.Thread(target=client) for _ in range(16)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(results) > 50, 60, "traffic before the swap")
        add_version(root / "swap", exported["b"], 2)
        wait_for(lambda: any(r[0] == 2 for r in results[-20:]), 90, "version 2 to take traffic")
        wait_for(lambda: "swap version 1 unloaded" in server.log(), 60, "version 1 to unload")
        mark = len(results)
        wait_for(lambda: len(results) > mark + 50, 60, "traffic after the swap")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    errors = [r for r in results if r[0] == "error"]
    assert errors == []
    assert "still in flight" not in server.log()
    answers[2] = next(s for v, s in results if v == 2)
    assert not np.allclose(answers[1], answers[2])
    for version, got in results:  # every answer is exactly one version's answer
        np.testing.assert_allclose(got, answers[version], rtol=1e-6)
    assert results[-1][0] == 2


def test_corrupt_version_is_refused_and_the_previous_keeps_serving(stub, model_stub, server, exported):
    root = server.log_path.parent / "serving"
    before = scores(stub.Predict(raw_request(model="guarded"), timeout=10))
    staging = root / "guarded" / ".staging-5"
    shutil.copytree(exported["b"], staging)
    pb = staging / "saved_model.pb"
    pb.write_bytes(pb.read_bytes()[: pb.stat().st_size // 3])
    staging.rename(root / "guarded" / "5")
    wait_for(lambda: "guarded version 5 refused" in server.log(), 60, "the corrupt version to be refused")
    response = stub.Predict(raw_request(model="guarded"), timeout=10)
    assert response.model_spec.version.value == 1
    np.testing.assert_allclose(scores(response), before)
    status = model_stub.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "guarded"}), timeout=10)
    states = {s.version: (s.state, s.status.error_message) for s in status.model_version_status}
    assert states[1][0] == get_model_status_pb2.ModelVersionStatus.AVAILABLE
    assert states[5][0] == get_model_status_pb2.ModelVersionStatus.END and states[5][1]


def test_reload_config_request(model_stub, stub, server):
    root = server.log_path.parent / "serving"
    config = model_server_config_pb2.ModelServerConfig()
    entry = config.model_config_list.config.add(name="mass", base_path=str(root / "mass"), model_platform="tensorflow")
    entry.model_version_policy.latest.num_versions = 1
    escape = model_server_config_pb2.ModelServerConfig()
    escape.CopyFrom(config)
    escape.model_config_list.config.add(name="evil", base_path=str(root / ".." / ".."), model_platform="tensorflow")
    code, details = rpc_code(model_stub.HandleReloadConfigRequest, model_management_pb2.ReloadConfigRequest(config=escape))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "is not under serving.allowed_base_paths" in details
    assert np.isfinite(scores(stub.Predict(raw_request(), timeout=10))).all()  # nothing changed
    evil = get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "evil"})
    assert rpc_code(model_stub.GetModelStatus, evil)[0] == grpc.StatusCode.NOT_FOUND


def test_loopline_predict_over_grpc_and_rest(server, tmp_path):
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([{"bill_length_mm": 40.0, "flipper_length_mm": 190, "island": "Dream"},
                                {"bill_length_mm": None, "flipper_length_mm": 220, "island": "Biscoe", "species": "x"}]))
    csv_rows = tmp_path / "rows.csv"
    csv_rows.write_text("bill_length_mm,flipper_length_mm,island\n40.0,190,Dream\nNA,220,Biscoe\n")
    outputs = []
    for path, extra in ((rows, ["--port", str(server.grpc_port)]), (csv_rows, ["--rest", "--port", str(server.rest_port)])):
        done = subprocess.run([sys.executable, "-m", "pipeline.cli", "predict", str(path), "--model", "penguins",
                               "--config", str(REPO / "loopline.yaml"), "--set", f"pipeline.root={tmp_path}", *extra],
                              capture_output=True, text=True, timeout=120, env=subprocess_env(), cwd=REPO)
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""  # TensorFlow's start-up lines went to the command's log
        outputs.append(done.stdout.strip().splitlines())
    assert outputs[0] == outputs[1]
    assert outputs[0][0].startswith("row 0: body_mass_g=") and "class=" in outputs[0][0]
    bad = subprocess.run([sys.executable, "-m", "pipeline.cli", "predict", str(rows), "--model", "nope",
                          "--port", str(server.grpc_port), "--config", str(REPO / "loopline.yaml"),
                          "--set", f"pipeline.root={tmp_path}"],
                         capture_output=True, text=True, timeout=120, env=subprocess_env(), cwd=REPO)
    assert bad.returncode == 1 and "NOT_FOUND" in bad.stderr
    logs = [path.read_text() for path in (tmp_path / "logs").glob("predict-*.log")]
    # A client command never loads TensorFlow's runtime (tests/test_deferred_imports.py): no C++ start-up lines.
    assert len(logs) == 3 and not any(re.search(r"^[IWE]\d{4} ", text, re.M) for text in logs)
