"""TFLite models served as TF Serving serves them with --prefer_tflite_model (serving.prefer_tflite):
a pushed version with the float32 variant as model.tflite answers `predict_raw` as its SavedModel
does within the parity gate's tolerance, on the eval split, for every head; requests the
interpreter cannot take are INVALID_ARGUMENT and the server keeps answering; the pool serves
concurrent requests; the flags set the keys. TF Serving's own two TFLite cases are in
tests/test_tf_serving_model_server.py."""
from __future__ import annotations

import concurrent.futures
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from tensorflow_serving.apis import classification_pb2, get_model_metadata_pb2, predict_pb2, prediction_service_pb2_grpc

from serving import signature_names as names
from serving import tf_serving_flags as flags
from serving.config import ServingConfig
from serving.config_writer import write_serving_configs
from serving.push import push_model
from serving.signature_names import TFLITE_MODEL_FILE as TFLITE_MODEL
from serving.tensors import from_numpy
from tests.conftest import REPO
from tests.serving_helpers import KINDS, ServerProcess, export_model, wait_for

pytestmark = pytest.mark.slow

LITE, SAVED = "lite", "saved"  # one model pushed with model.tflite, the same SavedModel without


@pytest.fixture(scope="module")
def pushed(tmp_path_factory):
    """A small two-head model and its float32 variant pushed under LITE, the SavedModel alone under SAVED."""
    from trainer import tflite

    folder = tmp_path_factory.mktemp("tflite")
    saved_model = export_model(folder / "export")
    variant = folder / "model_float32.tflite"
    variant.write_bytes(tflite.convert_variants(str(saved_model), ["float32"])["float32"])
    workspace = folder / "workspace"
    root = workspace / "serving"
    lite = push_model(str(saved_model), str(root / LITE), str(variant))
    push_model(str(saved_model), str(root / SAVED))
    for name in (LITE, SAVED):
        write_serving_configs(str(root), ServingConfig(model_name=name))
    return workspace, Path(lite.path), variant


@pytest.fixture(scope="module")
def server(pushed):
    workspace = pushed[0]
    server = ServerProcess(workspace, "serving.prefer_tflite=true", "serving.tflite_interpreters=2",
                           "serving.batching.enabled=false")
    try:
        wait_for(lambda: server.log().count("loaded and serving") >= 2, 60, "both models loaded")
        yield server
    finally:
        server.stop()


def eval_features() -> dict[str, np.ndarray]:
    """The penguins eval split's columns the model takes, as `predict_raw` wants them ([n, 1])."""
    from trainer.csv_examples import csv_to_tfrecords
    from trainer.evaluation import read_examples
    from trainer.features import parse_examples
    from trainer.tflite import as_numpy_inputs

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        _, eval_pattern = csv_to_tfrecords(str(REPO / "data" / "penguins.csv"), tmp)
        examples = read_examples(eval_pattern)
    parsed = parse_examples(tf.constant(examples), dict(KINDS))
    return {k: v.reshape(len(examples), 1) for k, v in as_numpy_inputs({k: v.numpy() for k, v in parsed.items()}).items()}


def predict(address: str, model: str, inputs: dict[str, np.ndarray], signature: str = names.PREDICT_RAW):
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = model, signature
    for alias, array in inputs.items():
        from_numpy(array, request.inputs[alias])
    with grpc.insecure_channel(address) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    return {alias: tf.make_ndarray(proto) for alias, proto in response.outputs.items()}


def test_the_push_puts_the_variant_beside_the_saved_model(pushed):
    _, version, variant = pushed
    assert (version / TFLITE_MODEL).read_bytes() == variant.read_bytes()
    assert (version / "saved_model.pb").exists()


def test_tflite_answers_equal_the_saved_models_on_the_eval_split(server):
    """Every head's outputs within the parity gate's float32 tolerance; the TFLite version says it
    runs through the interpreter, the other through its SavedModel."""
    from trainer.export_config import ExportConfig

    tolerance = ExportConfig().output_tolerance["float32"]
    features = eval_features()
    lite, saved = predict(server.grpc_target, LITE, features), predict(server.grpc_target, SAVED, features)
    assert set(lite) == set(saved) == {"scores", "classes", "body_mass_g"}
    for name in ("scores", "body_mass_g"):
        assert lite[name].shape == saved[name].shape == (len(features["island"]), saved[name].shape[1])
        scale = 800.0 if name == "body_mass_g" else 1.0  # regression outputs compared in label stds, as the gate does
        assert np.max(np.abs(lite[name] - saved[name])) / scale <= tolerance, name
    np.testing.assert_array_equal(lite["classes"], saved["classes"])
    log = server.log()
    assert f"model {LITE} version" in log and "signatures called through the TFLite interpreter (model.tflite)" in log


def test_metadata_lists_the_tflite_models_signature(server):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = LITE
    with grpc.insecure_channel(server.grpc_target) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata(request, timeout=30)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(signatures)
    (signature,) = signatures.signature_def.values()
    assert list(signatures.signature_def) == [names.PREDICT_RAW]
    assert set(signature.inputs) == set(KINDS) and set(signature.outputs) == {"scores", "classes", "body_mass_g"}
    assert signature.method_name == names.PREDICT_METHOD
    assert [d.size for d in signature.inputs["island"].tensor_shape.dim] == [-1, 1]


@pytest.mark.parametrize("change, words", [
    (lambda f: {**f, "bill_length_mm": f["bill_length_mm"].astype(np.float64)}, "Expects arg"),
    (lambda f: {**f, "island": f["island"].reshape(-1, 1, 1, 1)}, "island"),
    (lambda f: {**f, "bill_length_mm": f["bill_length_mm"][:1]}, "cannot run inputs of shapes bill_length_mm [1, 1]"),
])
def test_a_request_the_interpreter_cannot_take_is_invalid_argument(server, change, words):
    """A wrong dtype, a shape the signature does not allow, rows that do not match: refused with a
    message, and the server answers the next request."""
    features = {k: v[:3] for k, v in eval_features().items()}
    with pytest.raises(grpc.RpcError) as refused:
        predict(server.grpc_target, LITE, change(features))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in refused.value.details()
    assert predict(server.grpc_target, LITE, features)["scores"].shape == (3, 3)


def test_classify_on_a_tflite_model_gets_tf_servings_answer(server):
    """The TFLite model has no classify signature: Classify is refused as TF Serving refuses a
    signature it does not have, not with INTERNAL."""
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = LITE
    request.input.example_list.examples.add()
    with grpc.insecure_channel(server.grpc_target) as channel, pytest.raises(grpc.RpcError) as refused:
        prediction_service_pb2_grpc.PredictionServiceStub(channel).Classify(request, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "serving_default" in refused.value.details()


def test_rest_predict_on_tflite_and_its_bad_requests(server):
    body = {"signature_name": names.PREDICT_RAW,
            "inputs": {"bill_length_mm": [[40.0]], "flipper_length_mm": [[190.0]], "island": [["Dream"]]}}
    answer = requests.post(f"{server.rest_url}/v1/models/{LITE}:predict", json=body, timeout=30)
    assert answer.status_code == 200 and len(answer.json()["outputs"]["scores"][0]) == 3
    body["inputs"]["island"] = [[[["Dream"]]]]
    refused = requests.post(f"{server.rest_url}/v1/models/{LITE}:predict", json=body, timeout=30)
    assert refused.status_code == 400 and "island" in refused.json()["error"]


def test_concurrent_requests_share_the_pool(server):
    """16 requests at once on two interpreters: each answer is its own rows'."""
    features = eval_features()
    expected = predict(server.grpc_target, SAVED, features)["scores"]

    def one(row: int):
        return row, predict(server.grpc_target, LITE, {k: v[row:row + 1] for k, v in features.items()})["scores"]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for row, scores in pool.map(one, range(32)):
            np.testing.assert_allclose(scores[0], expected[row], atol=1e-4)


def test_the_flags_set_the_keys():
    values = flags.parse(["--prefer_tflite_model", "--num_tflite_pools=3", "--model_base_path=/m"]).values
    config = flags.serving_config(values, ServingConfig())
    assert (config.prefer_tflite, config.tflite_interpreters) == (True, 3)
    assert flags.serving_config(flags.parse(["--model_base_path=/m"]).values, ServingConfig()).prefer_tflite is False
    warned = flags.warnings_and_refusals(flags.parse(["--num_tflite_interpreters_per_pool=4"]))
    assert len(warned) == 1 and "--num_tflite_interpreters_per_pool=4 accepted but not applied" in warned[0]


@pytest.mark.parametrize("variant, written", [("float32", True), ("int8", False), ("", False)])
def test_the_pusher_writes_the_configured_variant_as_model_tflite(tmp_path, variant, written):
    """The Trainer's Format-TFLite/model_<variant>.tflite goes into the version as model.tflite; a
    variant the model lacks (not exported, or dropped by the parity gate), or none asked for: none."""
    from google.protobuf import json_format
    from tfx.proto import pusher_pb2
    from tfx.types import standard_artifacts

    from components.pusher import PusherExecutor
    from tests.push_helpers import small_saved_model

    model = standard_artifacts.Model()
    model.uri = str(tmp_path / "model")
    small_saved_model(f"{model.uri}/Format-Serving")
    (tmp_path / "model" / "Format-TFLite").mkdir()
    (tmp_path / "model" / "Format-TFLite" / "model_float32.tflite").write_bytes(b"float32 variant")
    blessing, pushed = standard_artifacts.ModelBlessing(), standard_artifacts.PushedModel()
    blessing.uri, pushed.uri = str(tmp_path / "blessing"), str(tmp_path / "pushed")
    blessing.set_int_custom_property("blessed", 1)
    destination = pusher_pb2.PushDestination(
        filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=str(tmp_path / "serving" / "m")))
    PusherExecutor().Do({"model": [model], "model_blessing": [blessing]}, {"pushed_model": [pushed]}, {
        "push_destination": json_format.MessageToJson(destination), "keep_versions": 5, "tracking": "",
        "registered_model": "m", "tflite_variant": variant})
    version = Path(pushed.get_string_custom_property("pushed_destination"))
    assert (version / "saved_model.pb").exists()
    assert (version / TFLITE_MODEL).exists() == written
    if written:
        assert (version / TFLITE_MODEL).read_bytes() == b"float32 variant"
