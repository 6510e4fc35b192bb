"""The serving fuzzer against a real `loopline serve`: a fixed seed and a few dozen cases per target
here (`make test`), LOOPLINE_FUZZ_EXAMPLES per target and a report with `make fuzz`
(docs/fuzzing.md). Cases: tests/fuzz_serving_cases.py; the server, senders and oracle:
tests/fuzz_serving.py. Every crash the fuzzer found is a named case of test_regression."""
from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import predict_pb2

from tests import fuzz_serving_cases as cases
from tests.fuzz_serving import PHASES, REPORT_VARIABLE, SLOW_CASES, FuzzServer, Oracle, examples, prepare_workspace, write_report

FUZZ = settings(derandomize=True, database=None, deadline=None, phases=PHASES, suppress_health_check=SLOW_CASES,
                print_blob=False)


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    server = FuzzServer(prepare_workspace(tmp_path_factory.mktemp("fuzz")))
    oracle = Oracle(server)
    try:
        yield oracle
    finally:
        server.stop()
        if os.environ.get(REPORT_VARIABLE):
            write_report(oracle, Path(os.environ[REPORT_VARIABLE]))


# -- gRPC ------------------------------------------------------------------------------------------
@settings(FUZZ, max_examples=examples(150))
@given(call=cases.predict_calls())
def test_grpc_predict(fuzz, call):
    fuzz.check("grpc_predict", call, lambda: fuzz.server.grpc(*call))


@settings(FUZZ, max_examples=examples(80))
@given(call=cases.example_calls())
def test_grpc_classify_regress_multi_inference(fuzz, call):
    fuzz.check("grpc_examples", call, lambda: fuzz.server.grpc(*call))


@settings(FUZZ, max_examples=examples(30))
@given(call=cases.metadata_calls())
def test_grpc_metadata_and_status(fuzz, call):
    fuzz.check("grpc_metadata", call, lambda: fuzz.server.grpc(*call))


@settings(FUZZ, max_examples=examples(80))
@given(call=cases.raw_calls())
def test_grpc_raw_bytes(fuzz, call):
    fuzz.check("grpc_raw_bytes", call, lambda: fuzz.server.grpc_bytes(*call))


# -- REST ------------------------------------------------------------------------------------------
@settings(FUZZ, max_examples=examples(120))
@given(request=cases.rest_predicts())
def test_rest_predict_bodies(fuzz, request):
    fuzz.check("rest_predict", request, lambda: fuzz.server.http(*request))


@settings(FUZZ, max_examples=examples(80))
@given(request=cases.rest_examples())
def test_rest_classify_regress_bodies(fuzz, request):
    fuzz.check("rest_examples", request, lambda: fuzz.server.http(*request))


@settings(FUZZ, max_examples=examples(80))
@given(request=cases.rest_paths())
def test_rest_paths(fuzz, request):
    fuzz.check("rest_paths", request, lambda: fuzz.server.http(*request))


# -- raw HTTP --------------------------------------------------------------------------------------
@settings(FUZZ, max_examples=examples(100))
@given(exchange=cases.http_exchanges())
def test_http_framing(fuzz, exchange):
    fuzz.check("http_framing", exchange, lambda: fuzz.server.http_exchange(*exchange))


@settings(FUZZ, max_examples=min(examples(3), 50))  # each waits for the server's head deadline
@given(head=cases.unfinished_heads())
def test_http_unfinished_head(fuzz, head):
    fuzz.check("http_unfinished_head", head, lambda: fuzz.server.unfinished_head(head))


# -- what the fuzzer found, and what stays handled -------------------------------------------------
def _predict(name: str, dtype: int, sizes: list[int], signature: str = "", **values) -> tuple:
    """A Predict call with one input of the given dtype, shape and values (the other inputs of a
    predict_raw call valid)."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = cases.MODEL, signature
    for other in cases.SIGNATURE_INPUTS[signature]:
        request.inputs[other].CopyFrom(cases.valid_tensor(other))
    tensor = tensor_pb2.TensorProto(dtype=dtype, **values)
    for size in sizes:
        tensor.tensor_shape.dim.add(size=size)
    request.inputs[name].CopyFrom(tensor)
    return "Predict", request, False


def _deep(depth: int, leaf) -> list:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def _rest(doc) -> tuple:
    return "POST", f"/v1/models/{cases.MODEL}:predict", cases.to_json(doc).encode()


EXAMPLE = cases.VALID_EXAMPLE.SerializeToString()
REGRESSIONS = {  # name: (sender, case)
    # Crashes found: SIGSEGV (TensorFlow's string tensors past rank 32), INTERNAL (NumPy's 64 dims).
    "grpc_string_rank_33_one_example": ("grpc", _predict("inputs", types_pb2.DT_STRING, [1] * 33, string_val=[EXAMPLE])),
    "grpc_string_rank_64_one_example": ("grpc", _predict("inputs", types_pb2.DT_STRING, [1] * 64, string_val=[EXAMPLE])),
    "grpc_float_rank_200": ("grpc", _predict("bill_length_mm", types_pb2.DT_FLOAT, [1] * 200, "predict_raw",
                                             float_val=[40.0])),
    "rest_b64_64_deep": ("http", _rest({"inputs": _deep(64, {"b64": base64.b64encode(b"\0").decode()})})),
    # Handled, to stay so.
    "grpc_shape_2e62_by_2e62": ("grpc", _predict("inputs", types_pb2.DT_STRING, [2**62, 2**62], string_val=[EXAMPLE])),
    "grpc_gzip_20mib_string": ("grpc", (*_predict("inputs", types_pb2.DT_STRING, [1],
                                                  string_val=[b"x" * (20 << 20)])[:2], True)),
    "rest_instances_33_deep": ("http", _rest({"instances": [_deep(33, cases.B64_EXAMPLE)]})),
    "http_negative_content_length": ("http_exchange", (
        b"POST /v1/models/penguins:predict HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}", "half_close")),
}


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_regression(fuzz, name):
    sender, case = REGRESSIONS[name]
    fuzz.check(f"regression {name}", case, lambda: getattr(fuzz.server, sender)(*case))


# -- a TFLite-served model (serving.prefer_tflite) -------------------------------------------------
def _valid_raw_predict() -> predict_pb2.PredictRequest:
    """The TFLite model's one signature, `predict_raw`, on valid [1, 1] inputs."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = cases.MODEL, "predict_raw"
    for name in cases.RAW_INPUTS:
        request.inputs[name].CopyFrom(cases.valid_tensor(name))
    return request


@st.composite
def raw_predict_calls(draw) -> tuple[str, predict_pb2.PredictRequest, bool]:
    """`predict_raw` calls with one input fuzzed (any dtype, shape and values) and the others valid:
    with the signature's shape check off, as TF Serving's mode runs, they reach the interpreter."""
    request = _valid_raw_predict()
    fuzzed = draw(st.sampled_from(sorted(cases.RAW_INPUTS)))
    request.inputs[fuzzed].CopyFrom(draw(cases.tensors(cases.RAW_INPUTS[fuzzed])))
    return "Predict", request, False


@pytest.fixture(scope="module")
def fuzz_tflite(tmp_path_factory):
    """The fuzzed model's float32 TFLite variant as its version's model.tflite, served through the
    interpreter (two of them), with the signature's shape check off."""
    from serving.signature_names import TFLITE_MODEL_FILE
    from trainer import tflite

    workspace = prepare_workspace(tmp_path_factory.mktemp("fuzz_tflite"))
    version = workspace / "serving" / cases.MODEL / "1"
    (version / TFLITE_MODEL_FILE).write_bytes(tflite.convert_variants(str(version), ["float32"])["float32"])
    server = FuzzServer(workspace, ("serving.prefer_tflite=true", "serving.tflite_interpreters=2",
                                    "serving.limits.check_signature_shapes=false"), _valid_raw_predict)
    try:
        yield Oracle(server)
    finally:
        server.stop()


@settings(FUZZ, max_examples=examples(100))
@given(call=raw_predict_calls())
def test_grpc_predict_tflite(fuzz_tflite, call):
    fuzz_tflite.check("grpc_predict_tflite", call, lambda: fuzz_tflite.server.grpc(*call))


@settings(FUZZ, max_examples=examples(40))
@given(call=cases.predict_calls())
def test_grpc_predict_any_signature_tflite(fuzz_tflite, call):
    fuzz_tflite.check("grpc_predict_any_tflite", call, lambda: fuzz_tflite.server.grpc(*call))
