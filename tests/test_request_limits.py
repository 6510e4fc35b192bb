"""The request limits (serving/request_limits.py) on a live server, in both start modes: what once
crashed the process (a string tensor of 33+ dimensions, over gRPC and as nested JSON) or answered
INTERNAL (200 dimensions) is a client error; the signature's TensorSpec is checked in loopline's
mode and not under TF Serving's flags; a request over the element limit is refused before its
values become Python objects, also under TF Serving's flags, where the message limit is INT32_MAX."""
from __future__ import annotations

import http.client
import json
from pathlib import Path

import grpc
import pytest
from tensorflow.core.example import example_pb2
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving.config import ServingConfig
from serving.config_writer import write_serving_configs
from tests.serving_helpers import (ServerProcess, TfServingServer, add_version, example, export_model, tree_rss_bytes,
                                   wait_for)

HALF_PLUS_TWO = Path(__file__).parent / "data" / "tf_serving" / "saved_model_half_plus_two_cpu"
HALF_PLUS_TWO_EXAMPLE = example_pb2.Example()
HALF_PLUS_TWO_EXAMPLE.features.feature["x"].float_list.value.append(2.0)
EXAMPLES = {"loopline": example().SerializeToString(), "tf_serving_flags": HALF_PLUS_TWO_EXAMPLE.SerializeToString()}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """{mode: (server, model, signature taking serialized examples)}; both start at once."""
    workspace = tmp_path_factory.mktemp("loopline_mode")
    add_version(workspace / "serving" / "penguins", export_model(tmp_path_factory.mktemp("export") / "m"), 1)
    write_serving_configs(str(workspace / "serving"), ServingConfig(model_name="penguins"))
    flags = TfServingServer(tmp_path_factory.mktemp("flags_mode"), model_name="default", model_path=HALF_PLUS_TWO,
                            wait=False)
    try:
        loopline = ServerProcess(workspace)
        try:
            flags.wait_until_ready(300)
            # WaitForServerReady asks gRPC only; REST starts after it: wait until it accepts too.
            wait_for(lambda: _accepts(flags.rest_port), 60, "the REST port")
            yield {"loopline": (loopline, "penguins", "predict"), "tf_serving_flags": (flags, "default", "classify_x_to_y")}
        finally:
            loopline.stop()
    finally:
        flags.stop()


def _accepts(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _target(server) -> str:
    return server.grpc_target if isinstance(server, ServerProcess) else server.grpc_address


def _predict(server, model: str, signature: str, shape: list[int], values: list[bytes]) -> grpc.RpcError | None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = model, signature
    tensor = request.inputs["inputs"]
    tensor.dtype = types_pb2.DT_STRING
    tensor.tensor_shape.dim.extend([tensor.tensor_shape.Dim(size=d) for d in shape])
    tensor.string_val.extend(values)
    with grpc.insecure_channel(_target(server), options=[("grpc.max_send_message_length", -1)]) as channel:
        try:
            prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)
        except grpc.RpcError as error:
            return error
    return None


def _rest_predict(server, model: str, body: dict) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=60)
    try:
        connection.request("POST", f"/v1/models/{model}:predict", body=json.dumps(body))
        answer = connection.getresponse()
        return answer.status, answer.read().decode()
    finally:
        connection.close()


def _alive(server) -> bool:
    return server.proc.poll() is None


@pytest.mark.parametrize("mode", ["loopline", "tf_serving_flags"])
@pytest.mark.parametrize("rank", [33, 64, 200])
def test_too_many_dimensions_is_a_client_error(servers, mode, rank):
    server, model, signature = servers[mode]
    error = _predict(server, model, signature, [1] * rank, [EXAMPLES[mode]])
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    assert f"{rank} dimensions; a request tensor may have at most 32 (serving.limits.max_tensor_rank)" in error.details()
    nested = {"b64": "AA=="}
    for _ in range(rank if rank < 200 else 100):
        nested = [nested]
    status, text = _rest_predict(server, model, {"signature_name": signature, "inputs": nested})
    assert status == 400 and "dimensions; a request tensor may have at most 32" in text, text
    assert _alive(server)
    assert _predict(server, model, signature, [1], [EXAMPLES[mode]]) is None  # still answering


def test_the_signatures_tensor_spec_is_checked_in_loopline_mode_only(servers):
    server, model, signature = servers["loopline"]
    error = _predict(server, model, signature, [1, 1], [EXAMPLES["loopline"]])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "input 'inputs': shape [1,1] does not match the signature's [-1] (-1: any size)"
    # Under TF Serving's flags the model's own op refuses it, as in TF Serving.
    server, model, signature = servers["tf_serving_flags"]
    error = _predict(server, model, signature, [1, 1], [EXAMPLES["tf_serving_flags"]])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "Expected serialized to be a vector, got shape: [1,1]" in error.details()


LIMIT = 16 * 1024 * 1024  # serving.limits.max_request_elements' default


def test_over_the_element_limit_is_refused_before_anything_is_allocated(servers):
    # Under TF Serving's flags the message limit is INT32_MAX. One string said to fill [20M]
    # would be 160 MB of NumPy pointers and 640 MB of TensorFlow strings; refused from the
    # shape, it costs nothing.
    server, model, signature = servers["tf_serving_flags"]
    before = tree_rss_bytes(server.proc.pid)
    count = 20 * 1024 * 1024
    error = _predict(server, model, signature, [count], [EXAMPLES["tf_serving_flags"]])
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.details() == (f"input 'inputs': shape [{count}] has more than {LIMIT} values, the limit "
                               "(serving.limits.max_request_elements)")
    assert tree_rss_bytes(server.proc.pid) - before < 100 << 20


def test_many_strings_are_refused_before_they_become_python_objects(servers):
    # 17M two-byte strings, a 68 MB message. Measured, the server's peak RSS: +1.0 GB refused from
    # their count (gRPC's buffers and the parsed message's arrays), +2.4 GB when they were decoded
    # (with the limit raised over them: Python objects, a NumPy array, TensorFlow's strings).
    server, model, signature = servers["tf_serving_flags"]
    before = tree_rss_bytes(server.proc.pid, "VmHWM")
    count = LIMIT + 1024 * 1024
    error = _predict(server, model, signature, [count], [b"ab"] * count)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "the limit" in error.details()
    grown = tree_rss_bytes(server.proc.pid, "VmHWM") - before
    print(f"the server's peak RSS grew by {grown >> 20} MB")
    assert grown < 1600 << 20
    # REST: a body with more commas than the limit has values is refused before it is parsed.
    body = b'{"inputs": [' + b"0," * count + b"0]}"
    connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=60)
    connection.request("POST", f"/v1/models/{model}:predict", body=body)
    answer = connection.getresponse()
    assert answer.status == 413 and "the JSON body holds more than" in answer.read().decode()
    assert _alive(server)
