"""TF Serving's own model-server tests, ported: the cases of
tensorflow_serving/model_servers/tensorflow_model_server_test.py (tensorflow/serving at 9d981c5),
on TF Serving's test data (tests/data/tf_serving, Apache-2.0), against `loopline serve` started
with TF Serving's flags as that test's harness starts `tensorflow_model_server`
(serving_helpers.TfServingServer). Each test names the case it ports; the requests and expected
answers are that test's. One server per group of cases (TF Serving starts one per set of flags),
all started together.

Also, from TF Serving's handler tests and issues users meet: the two-version model under the
`all` and `specific` policies with a label on each version, set by a config reload once both
load, and at start-up with --allow_version_labels_for_unavailable_models; malformed JSON.

testPredictOnTfLite and testPredictWithSignatureDefOnTfLite run in both start modes: with
--prefer_tflite_model, and in loopline's (serving.prefer_tflite) through ServerProcess.

Left out (docs/serving.md says why): test_profiler_service_with_valid_trace_request
(no profiler service), test_tf_text (needs the tensorflow-text ops, and its SavedModel is not in
the repository's stored files)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time

import grpc
import pytest
import requests
import tensorflow as tf
from tensorflow.core.framework import types_pb2
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

from tests.conftest import REPO, subprocess_env
from tests.serving_helpers import ServerProcess, TfServingServer, wait_for

pytestmark = pytest.mark.slow

DATA = REPO / "tests" / "data" / "tf_serving"
HALF_PLUS_TWO = DATA / "saved_model_half_plus_two_cpu"
HALF_PLUS_TWO_TF2 = DATA / "saved_model_half_plus_two_tf2_cpu"
HALF_PLUS_THREE = DATA / "saved_model_half_plus_three"
TWO_VERSIONS = DATA / "saved_model_half_plus_two_2_versions"
TFLITE = DATA / "saved_model_half_plus_two_tflite"  # model.tflite only: no SignatureDefs, x [1, 1] -> y
TFLITE_WITH_SIGDEF = DATA / "saved_model_half_plus_two_tflite_with_sigdef"  # serving_default in its metadata
RPC_TIMEOUT = 20.0
DEFAULT = "serving_default"


# -- the harness's checks (tensorflow_model_server_test_base.py) -------------------------------------
def model_version(model_path) -> int:
    """_GetModelVersion: the one version folder's name as an int (`00000123` -> 123)."""
    (child,) = [p.name for p in model_path.iterdir() if p.is_dir()]
    return int(child)


def verify_model_spec(spec, name: str, signature: str, version: int) -> None:
    assert (spec.name, spec.signature_name, spec.version.value) == (name, signature, version)


def verify_predict(address: str, expected_output: float, expected_version: int, model_name: str = "default",
                   specify_output: bool = True, batch_input: bool = False, signature_name: str = DEFAULT,
                   input_name: str = "x", output_name: str = "y") -> None:
    """VerifyPredictRequest: x = [2.0] (shape [1], or [1, 1] with batch_input), one float out.
    `input_name`/`output_name` are ours, for a model with other names (Keras 3)."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature_name
    request.inputs[input_name].dtype = types_pb2.DT_FLOAT
    request.inputs[input_name].float_val.append(2.0)
    request.inputs[input_name].tensor_shape.dim.add().size = 1
    if batch_input:
        request.inputs[input_name].tensor_shape.dim.add().size = 1
    if specify_output:
        request.output_filter.append(output_name)
    with grpc.insecure_channel(address) as channel:
        result = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, RPC_TIMEOUT)
    assert output_name in result.outputs
    assert result.outputs[output_name].dtype == types_pb2.DT_FLOAT
    assert list(result.outputs[output_name].float_val) == [expected_output]
    verify_model_spec(result.model_spec, model_name, signature_name, expected_version)


def sorted_object(obj):
    """SortedObject: nested lists and objects in a fixed order, for comparing metadata JSON."""
    if isinstance(obj, dict):
        return sorted((k, sorted_object(v)) for k, v in obj.items())
    if isinstance(obj, list):
        return sorted(sorted_object(x) for x in obj)
    return obj


def stub(address: str, service=prediction_service_pb2_grpc.PredictionServiceStub):
    return service(grpc.insecure_channel(address))


def example_input(request, x: float = 2.0):
    request.input.example_list.examples.add().features.feature["x"].float_list.value.extend([x])
    return request


def start(tmp_path_factory, name: str, *flags: str, **kwargs) -> TfServingServer:
    """A server for one group of cases, not waited for: every group's server starts at once (most
    of a start is importing TensorFlow), and each group waits for its own."""
    return TfServingServer(tmp_path_factory.mktemp(name), *flags, wait=False, **kwargs)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """The servers of every group below, started together; stopped when the module ends."""
    started = {
        "half_plus_two": start(  # RunServer('default', saved_model_half_plus_two_cpu), with the monitoring
            # config (testPrometheusEndpoint), batching (_TestPredict's batching_parameters_file) and
            # testGoodGrpcChannelArgs' channel arguments on the same server
            tmp_path_factory, "half_plus_two", f"--monitoring_config_file={DATA / 'monitoring_config.txt'}",
            "--enable_batching", f"--batching_parameters_file={DATA / 'batching_config.txt'}",
            model_name="default", model_path=HALF_PLUS_TWO,
            grpc_channel_arguments="grpc.max_connection_age_ms=2000,grpc.lb_policy_name=grpclb"),
    }
    try:
        started["good_config"] = good_config_server(tmp_path_factory)
        started["reload"] = reload_server(tmp_path_factory)
        started["two_versions"] = two_versions_server(tmp_path_factory)
        started["tf2"] = tf2_server(tmp_path_factory)  # writes its models first, while the others start
        for name, path in (("tflite", TFLITE), ("tflite_with_sigdef", TFLITE_WITH_SIGDEF)):
            started[name] = start(tmp_path_factory, name, "--prefer_tflite_model=true", model_name="default",
                                  model_path=path)
        yield started
    finally:
        for server in started.values():
            server.stop()


def ready(servers, name: str) -> TfServingServer:
    servers[name].wait_until_ready(300)
    return servers[name]


# -- half_plus_two (TF1): the cases on `--model_name=default --model_base_path=...` --------------------
@pytest.fixture(scope="module")
def half_plus_two(servers):
    return ready(servers, "half_plus_two")


def test_get_model_status(half_plus_two):
    """testGetModelStatus"""
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "default"
    result = stub(half_plus_two.grpc_address, model_service_pb2_grpc.ModelServiceStub).GetModelStatus(request, RPC_TIMEOUT)
    assert len(result.model_version_status) == 1
    assert result.model_version_status[0].version == 123
    assert result.model_version_status[0].status.error_code == 0


def test_get_model_metadata(half_plus_two):
    """testGetModelMetadata"""
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "default"
    request.metadata_field.append("signature_def")
    result = stub(half_plus_two.grpc_address).GetModelMetadata(request, RPC_TIMEOUT)
    assert result.model_spec.name == "default"
    assert result.model_spec.version.value == model_version(HALF_PLUS_TWO)
    assert len(result.metadata) == 1 and "signature_def" in result.metadata


def classify(address: str, model_path) -> None:
    """_TestClassify"""
    request = example_input(classification_pb2.ClassificationRequest())
    request.model_spec.name = "default"
    request.model_spec.signature_name = "classify_x_to_y"
    result = stub(address).Classify(request, RPC_TIMEOUT)
    assert len(result.result.classifications) == 1
    assert len(result.result.classifications[0].classes) == 1
    assert result.result.classifications[0].classes[0].score == 3.0
    verify_model_spec(result.model_spec, "default", "classify_x_to_y", model_version(model_path))


def regress(address: str, model_path) -> None:
    """_TestRegress"""
    request = example_input(regression_pb2.RegressionRequest())
    request.model_spec.name = "default"
    request.model_spec.signature_name = "regress_x_to_y"
    result = stub(address).Regress(request, RPC_TIMEOUT)
    assert len(result.result.regressions) == 1
    assert result.result.regressions[0].value == 3.0
    verify_model_spec(result.model_spec, "default", "regress_x_to_y", model_version(model_path))


def multi_inference(address: str, model_path) -> None:
    """_TestMultiInference"""
    request = example_input(inference_pb2.MultiInferenceRequest())
    for signature, method in (("regress_x_to_y", "tensorflow/serving/regress"),
                              ("classify_x_to_y", "tensorflow/serving/classify")):
        task = request.tasks.add()
        task.model_spec.name, task.model_spec.signature_name, task.method_name = "default", signature, method
    result = stub(address).MultiInference(request, RPC_TIMEOUT)
    assert len(result.results) == 2
    assert result.results[0].regression_result.regressions[0].value == 3.0
    assert result.results[1].classification_result.classifications[0].classes[0].score == 3.0
    for i in range(2):
        verify_model_spec(result.results[i].model_spec, "default", request.tasks[i].model_spec.signature_name,
                          model_version(model_path))


def test_classify(half_plus_two):
    """testClassify"""
    classify(half_plus_two.grpc_address, HALF_PLUS_TWO)


def test_regress(half_plus_two):
    """testRegress"""
    regress(half_plus_two.grpc_address, HALF_PLUS_TWO)


def test_multi_inference(half_plus_two):
    """testMultiInference"""
    multi_inference(half_plus_two.grpc_address, HALF_PLUS_TWO)


def test_predict_saved_model(half_plus_two):
    """testPredictSavedModel (_TestPredict, with and without output_filter; batching on, as its
    batching_parameters_file variant): x is a [1] tensor where the signature says [-1, 1]."""
    verify_predict(half_plus_two.grpc_address, 3.0, model_version(HALF_PLUS_TWO))
    verify_predict(half_plus_two.grpc_address, 3.0, model_version(HALF_PLUS_TWO), specify_output=False)


# -- TF Lite: RunServer(..., model_type='tflite') adds --prefer_tflite_model=true --------------------
@pytest.mark.parametrize("name, model_path", [("tflite", TFLITE), ("tflite_with_sigdef", TFLITE_WITH_SIGDEF)])
def test_predict_on_tflite(servers, name, model_path):
    """testPredictOnTfLite and testPredictWithSignatureDefOnTfLite: x = [2.0] (shape [1], resized from
    the model's [1, 1]) -> 3.0, all outputs; the version is the model's folder (both 123)."""
    verify_predict(ready(servers, name).grpc_address, 3.0, model_version(model_path), specify_output=False)


@pytest.fixture(scope="module")
def loopline_tflite(tmp_path_factory):
    """Both TFLite models served by `loopline serve` in its own mode, with serving.prefer_tflite."""
    from serving.config import ServingConfig
    from serving.config_writer import write_serving_configs

    workspace = tmp_path_factory.mktemp("loopline_tflite")
    for name, path in (("tflite", TFLITE), ("tflite_with_sigdef", TFLITE_WITH_SIGDEF)):
        shutil.copytree(path, workspace / "serving" / name)
        write_serving_configs(str(workspace / "serving"), ServingConfig(model_name=name))
    server = ServerProcess(workspace, "serving.prefer_tflite=true", "serving.tflite_interpreters=2")
    try:
        wait_for(lambda: "tflite_with_sigdef version 123 loaded" in server.log() and "tflite version 123" in server.log(),
                 60, "both TFLite models loaded")
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("name, model_path", [("tflite", TFLITE), ("tflite_with_sigdef", TFLITE_WITH_SIGDEF)])
def test_predict_on_tflite_in_loopline_mode(loopline_tflite, name, model_path):
    """The same cases in loopline's mode. Its request limits check the signature's shape, [1, 1]
    here: TF Serving's [1] request is refused before the interpreter, a [1, 1] one answers 3.0."""
    address = loopline_tflite.grpc_target
    verify_predict(address, 3.0, model_version(model_path), model_name=name, specify_output=False, batch_input=True)
    with pytest.raises(grpc.RpcError) as refused:
        verify_predict(address, 3.0, model_version(model_path), model_name=name, specify_output=False)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"model {name} version 123 loaded and serving (folder {loopline_tflite.workspace / 'serving' / name / '00000123'}, " \
           "signatures called through the TFLite interpreter (model.tflite))" in loopline_tflite.log()


def test_good_grpc_channel_args(half_plus_two):
    """testGoodGrpcChannelArgs: the server starts with grpc.max_connection_age_ms and
    grpc.lb_policy_name given, and serves; a connection older than 2 s is replaced transparently."""
    verify_predict(half_plus_two.grpc_address, 3.0, model_version(HALF_PLUS_TWO), specify_output=False)
    assert "grpc.max_connection_age_ms=2000,grpc.lb_policy_name=grpclb,grpc.so_reuseaddr=1" in " ".join(
        half_plus_two.command)


def test_predict_uds(half_plus_two):
    """testPredictUDS: Predict over the Unix socket of --grpc_socket_path."""
    verify_predict(f"unix:{half_plus_two.socket_path}", 3.0, model_version(HALF_PLUS_TWO), specify_output=False)


def rest(server, path: str, body=None) -> dict:
    """CallREST: GET without a body, POST with one; the answer's JSON."""
    url = f"{server.rest_url}{path}"
    response = requests.post(url, json=body, timeout=30) if body is not None else requests.get(url, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def test_classify_rest(half_plus_two):
    """testClassifyREST"""
    body = {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]}
    assert rest(half_plus_two, "/v1/models/default:classify", body) == {"results": [[["", 3.0]]]}


def test_regress_rest(half_plus_two):
    """testRegressREST"""
    body = {"signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]}
    assert rest(half_plus_two, "/v1/models/default:regress", body) == {"results": [3.0]}


def test_predict_rest(half_plus_two):
    """testPredictREST: row format, each instance a scalar on a [-1, 1] signature."""
    assert rest(half_plus_two, "/v1/models/default:predict", {"instances": [2.0, 3.0, 4.0]}) == {"predictions": [3.0, 3.5, 4.0]}


def test_predict_columnar_rest(half_plus_two):
    """testPredictColumnarREST"""
    assert rest(half_plus_two, "/v1/models/default:predict", {"inputs": [2.0, 3.0, 4.0]}) == {"outputs": [3.0, 3.5, 4.0]}


def test_get_status_rest(half_plus_two):
    """testGetStatusREST"""
    assert rest(half_plus_two, "/v1/models/default") == {"model_version_status": [
        {"version": "123", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}


def test_get_model_metadata_rest(half_plus_two):
    """testGetModelMetadataREST: the answer equals half_plus_two_model_metadata.json (sorted, as there)."""
    expected = json.loads((DATA / "half_plus_two_model_metadata.json").read_text())
    assert sorted_object(rest(half_plus_two, "/v1/models/default/metadata")) == sorted_object(expected)


def test_prometheus_endpoint(half_plus_two):
    """testPrometheusEndpoint: the path of --monitoring_config_file serves metric type lines."""
    response = requests.get(f"{half_plus_two.rest_url}/monitoring/prometheus/metrics", timeout=30)
    assert response.status_code == 200 and "# TYPE" in response.text


@pytest.mark.parametrize("body", [
    b"{" * 200_000,  # deeper than Python's recursion limit
    b'{"instances": ' + b"[" * 300 + b"2.0" + b"]" * 300 + b"}",  # deeper than any tensor
    b'{"instances": [' + b"9" * 5000 + b"]}",  # past Python's integer digit limit
    b'{"instances": ["\\ud800"], "signature_name": "serving_default"}',  # a lone surrogate
    b'{"instances": ["\xff"]}',  # not UTF-8
    b'{"instances": [2.0, ',  # cut short
])
def test_malformed_json_is_400_and_the_server_stays_up(half_plus_two, body):
    """loopline's rule for what TF Serving's parser and handler do not specify: 400, the error
    in TF Serving's `{"error": "JSON Parse error: ..."}` family, never 500; the next request is served."""
    response = requests.post(f"{half_plus_two.rest_url}/v1/models/default:predict", data=body, timeout=30)
    assert response.status_code == 400 and response.json()["error"].startswith("JSON Parse error: ")
    assert rest(half_plus_two, "/v1/models/default:predict", {"instances": [2.0]}) == {"predictions": [3.0]}


def test_lenient_json_as_tf_serving(half_plus_two):
    """What RapidJSON with TF Serving's flags takes: NaN and Infinity, data after the document."""
    response = requests.post(f"{half_plus_two.rest_url}/v1/models/default:predict",
                             data=b'{"instances": [2.0, NaN, Infinity]} and then anything', timeout=30)
    assert response.status_code == 200 and response.text == '{"predictions":[3.0,NaN,Infinity]}'


# -- TF2 and Keras SavedModels, one server with a model config file ------------------------------------
def _save_tf_module(path) -> None:
    """test_tf_saved_model_save's model: y = v1 * v2 * x, one signature on a TensorSpec(None)."""
    root = tf.train.Checkpoint()
    root.v1, root.v2 = tf.Variable(3.0), tf.Variable(2.0)
    root.f = tf.function(lambda x: {"y": root.v1 * root.v2 * x})
    tf.saved_model.save(root, str(path), root.f.get_concrete_function(tf.TensorSpec(None, tf.float32)))


def _save_two_signatures(path) -> None:
    """test_tf_saved_model_save_multiple_signatures' model."""
    root = tf.train.Checkpoint()
    root.f = tf.function(lambda x: {"y": 1.0}, input_signature=[tf.TensorSpec(None, tf.float32)])
    root.g = tf.function(lambda x: {"y": 2.0}, input_signature=[tf.TensorSpec(None, tf.float32)])
    tf.saved_model.save(root, str(path), signatures={DEFAULT: root.f, "custom_signature_key": root.g})


def _save_tf_keras_sequential(path) -> None:
    """test_sequential_keras_saved_model_save's model, built with tf_keras (Keras 2) as `tf.keras`
    was there: its signature keeps the layers' names, `x` and `y`."""
    import tf_keras

    model = tf_keras.models.Sequential()
    model.add(tf_keras.layers.Input(dtype="float32", shape=(1,), name="x"))
    model.add(tf_keras.layers.Lambda(lambda x: x, name="y"))
    tf.saved_model.save(model, str(path))


def _save_keras3_sequential(path, export: bool) -> None:
    """The same model in Keras 3: tf.saved_model.save names its input `inputs` and its output
    `output_0`; model.export keeps the input's name `x` (output `output_0`)."""
    import keras

    model = keras.Sequential([keras.Input(shape=(1,), name="x"), keras.layers.Lambda(lambda x: x, name="y")])
    if export:
        model.export(str(path), verbose=False)
    else:
        tf.saved_model.save(model, str(path))


_DISTRIBUTED_EXPORT = """
import sys
import tensorflow as tf
import tf_keras
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(devices=("/cpu:0", "/cpu:1"))
with strategy.scope():
    model = tf_keras.models.Sequential()
    model.add(tf_keras.layers.Input(dtype="float32", shape=(1,), name="x"))
    model.add(tf_keras.layers.Dense(1, kernel_initializer="ones", bias_initializer="zeros"))
    model.add(tf_keras.layers.Lambda(lambda x: x, name="y"))
tf.saved_model.save(model, sys.argv[1])
"""

SAVED_MODELS = {  # model name -> how its version 123 is written
    "tf_saved_model_save": _save_tf_module,
    "multiple_signatures": _save_two_signatures,
    "keras_sequential": _save_tf_keras_sequential,
    "keras3_saved_model_save": lambda path: _save_keras3_sequential(path, export=False),
    "keras3_export": lambda path: _save_keras3_sequential(path, export=True),
}


def config_file(path, models: dict) -> None:
    """A ModelServerConfig text file: {name: base path}."""
    config = model_server_config_pb2.ModelServerConfig()
    for name, base in models.items():
        config.model_config_list.config.add(name=name, base_path=str(base), model_platform="tensorflow")
    path.write_text(str(config))


def tf2_server(tmp_path_factory) -> TfServingServer:
    """TF2 half_plus_two as `default` (the *Tf2 cases), the SavedModels the saved-model cases write,
    each in `<base>/00000123` as those cases write them, and half_plus_two: one server for all of
    them, its config file read once (testModelConfigReloadWithZeroPollPeriod's flag)."""
    base = tmp_path_factory.mktemp("tf2_models")
    distributed = subprocess.Popen([sys.executable, "-c", _DISTRIBUTED_EXPORT, str(base / "distributed" / "00000123")],
                                   env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    models = {"default": HALF_PLUS_TWO_TF2, "half_plus_two": HALF_PLUS_TWO}
    for name, save in SAVED_MODELS.items():
        save(base / name / "00000123")
        models[name] = base / name
    assert distributed.wait(300) == 0, distributed.stderr.read().decode()[-2000:]
    models["distributed"] = base / "distributed"
    config_file(base / "models.config", models)
    server = start(tmp_path_factory, "tf2_server", "--model_config_file_poll_wait_seconds=0",
                   model_config_file=base / "models.config")
    server.models, server.config_path = models, base / "models.config"
    return server


@pytest.fixture(scope="module")
def tf2_models(servers):
    server = ready(servers, "tf2")
    return server, server.models, server.config_path


def test_classify_tf2(tf2_models):
    """testClassifyTf2 (its classify signature's method name is predict: no check by default)"""
    classify(tf2_models[0].grpc_address, HALF_PLUS_TWO_TF2)


def test_regress_tf2(tf2_models):
    """testRegressTf2"""
    regress(tf2_models[0].grpc_address, HALF_PLUS_TWO_TF2)


def test_multi_inference_tf2(tf2_models):
    """testMultiInferenceTf2"""
    multi_inference(tf2_models[0].grpc_address, HALF_PLUS_TWO_TF2)


def test_tf_saved_model_save(tf2_models):
    """test_tf_saved_model_save: 3 * 2 * 2.0"""
    server, models, _ = tf2_models
    verify_predict(server.grpc_address, 12.0, model_version(models["tf_saved_model_save"]),
                   model_name="tf_saved_model_save", specify_output=False)


def test_tf_saved_model_save_multiple_signatures(tf2_models):
    """test_tf_saved_model_save_multiple_signatures"""
    server, models, _ = tf2_models
    version = model_version(models["multiple_signatures"])
    verify_predict(server.grpc_address, 2.0, version, model_name="multiple_signatures", signature_name="custom_signature_key")
    verify_predict(server.grpc_address, 1.0, version, model_name="multiple_signatures")


def test_sequential_keras_saved_model_save(tf2_models):
    """test_sequential_keras_saved_model_save (tf_keras)"""
    server, models, _ = tf2_models
    verify_predict(server.grpc_address, 2.0, model_version(models["keras_sequential"]), model_name="keras_sequential",
                   batch_input=True, specify_output=False)


@pytest.mark.parametrize("name, input_name", [("keras3_saved_model_save", "inputs"), ("keras3_export", "x")])
def test_keras3_sequential_with_its_own_names(tf2_models, name, input_name):
    """The Keras Sequential case with a Keras 3 model: the same request under Keras 3's names."""
    server, models, _ = tf2_models
    verify_predict(server.grpc_address, 2.0, model_version(models[name]), model_name=name, batch_input=True,
                   input_name=input_name, output_name="output_0")


def test_distrat_sequential_keras_saved_model_save(tf2_models):
    """test_distrat_sequential_keras_saved_model_save: built under a MirroredStrategy on two
    virtual CPUs (in a process of its own, as the devices must be set before TensorFlow starts)."""
    server, models, _ = tf2_models
    verify_predict(server.grpc_address, 2.0, model_version(models["distributed"]), model_name="distributed",
                   batch_input=True, specify_output=False)


# -- model config files --------------------------------------------------------------------------------
def good_model_config(folder):
    """__BuildModelConfigFile: good_model_config.txt with its placeholders filled in."""
    text = (DATA / "good_model_config.txt").read_text()
    text = text.replace("${TEST_HALF_PLUS_TWO_DIR}", str(HALF_PLUS_TWO)).replace("${TEST_HALF_PLUS_THREE_DIR}", str(HALF_PLUS_THREE))
    path = folder / "good_model_config.conf"
    path.write_text(text)
    return path


def manifest_flags(folder) -> list[str]:
    """infra/k8s/tf-serving.yaml's container arguments as written, but for this machine's ports and
    files: the ports are the harness's, the config files' folder a local one."""
    import yaml

    docs = {d["kind"]: d for d in yaml.safe_load_all((REPO / "infra" / "k8s" / "tf-serving.yaml").read_text()) if d}
    (container,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    (mount,) = container["volumeMounts"]
    shutil.copy(DATA / "monitoring_config.txt", folder / "monitoring.config")
    return [a.replace(mount["mountPath"], str(folder)) for a in container["args"]
            if not a.startswith(("--port=", "--rest_api_port=", "--model_config_file="))]


def good_config_server(tmp_path_factory) -> TfServingServer:
    """testGoodModelConfig's server, started with the rest of infra/k8s/tf-serving.yaml's arguments
    (its config poll, monitoring file, warmup, labels flag): the manifest's flags work as written."""
    folder = tmp_path_factory.mktemp("good_config")
    return start(tmp_path_factory, "good_config_server", *manifest_flags(folder), model_config_file=good_model_config(folder))


@pytest.fixture(scope="module")
def good_config(servers):
    return ready(servers, "good_config")


def test_good_model_config(good_config):
    """testGoodModelConfig"""
    for name, output, path in (("half_plus_two", 3.0, HALF_PLUS_TWO), ("half_plus_three", 4.0, HALF_PLUS_THREE)):
        verify_predict(good_config.grpc_address, output, model_version(path), model_name=name)
        verify_predict(good_config.grpc_address, output, model_version(path), model_name=name, specify_output=False)


def test_manifest_arguments_are_taken_without_a_warning(good_config):
    assert "unknown argument" not in good_config.log() and "not applied" not in good_config.log()
    # No command log with TF Serving's flags: TensorFlow's C++ INFO lines at its start are dropped.
    assert not re.search(r"^I\d{4} |absl::InitializeLog", good_config.log(), re.M), good_config.log()
    assert "--enable_model_warmup=true" in good_config.command
    assert requests.get(f"{good_config.rest_url}/monitoring/prometheus/metrics", timeout=30).status_code == 200


def test_bad_model_config(tmp_path, capsys):
    """testBadModelConfig: the server does not start, and says TF Serving's parser's words."""
    from pipeline.cli import main

    code = main(["serve", f"--model_config_file={DATA / 'bad_model_config.txt'}", "--port=0",
                 f"--grpc_socket_path={tmp_path / 's'}"])
    err = capsys.readouterr().err
    assert code == 255
    assert f"Failed to start server. Error: INVALID_ARGUMENT: Invalid protobuf file: '{DATA / 'bad_model_config.txt'}'" in err
    assert "Error parsing text-format tensorflow.serving.ModelServerConfig" in err


BASE_CONFIG = """
model_config_list: {{
  config: {{
    name: "{name}",
    base_path: "{model_path}",
    model_platform: "tensorflow"
  }}
}}
"""


def reload_server(tmp_path_factory) -> TfServingServer:
    folder = tmp_path_factory.mktemp("reload")
    config = folder / "model_config.txt"
    config.write_text(BASE_CONFIG.format(name="half_plus_two", model_path=HALF_PLUS_TWO))
    server = start(tmp_path_factory, "reload_server", "--model_config_file_poll_wait_seconds=1", model_config_file=config)
    server.config_path = config
    return server


def test_model_config_reload(servers):
    """testModelConfigReload: --model_config_file_poll_wait_seconds=1 picks up a rewritten config
    (TF Serving's test sleeps 10 s; here the answer is awaited)."""
    server = ready(servers, "reload")
    verify_predict(server.grpc_address, 3.0, model_version(HALF_PLUS_TWO), model_name="half_plus_two", specify_output=False)
    server.config_path.write_text(BASE_CONFIG.format(name="half_plus_three", model_path=HALF_PLUS_THREE))

    def served():
        try:
            verify_predict(server.grpc_address, 4.0, model_version(HALF_PLUS_THREE), model_name="half_plus_three",
                           specify_output=False)
            return True
        except grpc.RpcError:
            return False

    wait_for(served, 30, "half_plus_three to be served")


def test_model_config_reload_with_zero_poll_period(tf2_models):
    """testModelConfigReloadWithZeroPollPeriod: with 0 the config file is read once, so a rewrite
    (to half_plus_three alone) changes nothing."""
    server, _, config = tf2_models
    verify_predict(server.grpc_address, 3.0, model_version(HALF_PLUS_TWO), model_name="half_plus_two", specify_output=False)
    config.write_text(BASE_CONFIG.format(name="half_plus_three", model_path=HALF_PLUS_THREE))
    time.sleep(0 + 1)  # poll_period + 1, as there
    verify_predict(server.grpc_address, 3.0, model_version(HALF_PLUS_TWO), model_name="half_plus_two", specify_output=False)


def test_bad_model_is_refused_as_a_session_bundle(tmp_path, capsys):
    """_TestBadModel (disabled there, and written for an up-conversion TF Serving has removed): by
    the current sources a Session Bundle is UNIMPLEMENTED, and a model that does not load at
    start-up stops the server with ServerCore's message."""
    from pipeline.cli import main

    code = main(["serve", "--model_name=default", f"--model_base_path={DATA / 'bad_half_plus_two'}", "--port=0",
                 f"--grpc_socket_path={tmp_path / 's'}"])
    err = capsys.readouterr().err
    assert code == 255
    assert ("Failed to start server. Error: UNKNOWN: 1 model(s) did not become available: {{{name: default version: "
            "123} due to error: UNIMPLEMENTED: Session Bundle is deprecated and removed.}, }") in err


# -- two versions, labels ------------------------------------------------------------------------------
def labelled_config(policy: str, labels: dict[str, int] | None = None) -> model_server_config_pb2.ModelServerConfig:
    config = model_server_config_pb2.ModelServerConfig()
    entry = config.model_config_list.config.add(name="default", base_path=str(TWO_VERSIONS), model_platform="tensorflow")
    if policy == "all":
        entry.model_version_policy.all.SetInParent()
    else:
        entry.model_version_policy.specific.versions.extend([123, 124])
    for label, version in (labels or {}).items():
        entry.version_labels[label] = version
    return config


def predict_version(address: str, **spec) -> int:
    """The version that answers a Predict (half_plus_two: y = 3.0 for x = 2.0) for a model spec."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "default"
    for key, value in spec.items():
        if key == "version":
            request.model_spec.version.value = value
        else:
            setattr(request.model_spec, key, value)
    request.inputs["x"].CopyFrom(tf.make_tensor_proto([[2.0]], tf.float32))
    result = stub(address).Predict(request, RPC_TIMEOUT)
    assert list(result.outputs["y"].float_val) == [3.0]
    return result.model_spec.version.value


def two_versions_server(tmp_path_factory) -> TfServingServer:
    """saved_model_half_plus_two_2_versions under `specific` with a label on each version in the
    config file the server starts with: taken only with --allow_version_labels_for_unavailable_models."""
    folder = tmp_path_factory.mktemp("two_versions")
    config = folder / "models.config"
    config.write_text(str(labelled_config("specific", {"stable": 123, "canary": 124})))
    return start(tmp_path_factory, "two_versions_server", "--allow_version_labels_for_unavailable_models",
                 model_config_file=config)


@pytest.fixture(scope="module")
def two_versions(servers):
    return ready(servers, "two_versions")


def assert_labels_route(server) -> None:
    address = server.grpc_address
    assert predict_version(address, version_label="stable") == 123
    assert predict_version(address, version_label="canary") == 124
    assert predict_version(address, version=123) == 123 and predict_version(address) == 124
    assert rest(server, "/v1/models/default/labels/stable:predict", {"instances": [[2.0]]}) == {"predictions": [[3.0]]}
    assert rest(server, "/v1/models/default/labels/stable/metadata")["model_spec"]["version"] == "123"


def test_labels_at_start_up_with_allow_version_labels_for_unavailable_models(two_versions):
    assert_labels_route(two_versions)


@pytest.mark.parametrize("policy", ["all", "specific"])
def test_labels_set_by_a_config_reload_once_both_versions_load(two_versions, policy):
    """HandleReloadConfigRequest with a label on each version, sent once both are loaded (the
    handler tests' order): first the policy without labels, then with them."""
    model_service = stub(two_versions.grpc_address, model_service_pb2_grpc.ModelServiceStub)
    model_service.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(config=labelled_config(policy)),
                                            RPC_TIMEOUT)
    status = model_service.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "default"}),
                                          RPC_TIMEOUT)
    available = get_model_status_pb2.ModelVersionStatus.AVAILABLE
    assert [(s.version, s.state) for s in status.model_version_status] == [(123, available), (124, available)]
    with pytest.raises(grpc.RpcError) as info:  # the labels went with the config that had them
        predict_version(two_versions.grpc_address, version_label="stable")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    reload = model_management_pb2.ReloadConfigRequest(config=labelled_config(policy, {"stable": 123, "canary": 124}))
    assert model_service.HandleReloadConfigRequest(reload, RPC_TIMEOUT).status.error_code == 0
    assert_labels_route(two_versions)


def test_a_label_moved_to_a_version_not_loaded_is_refused(two_versions):
    """UpdateModelVersionLabelMap: even with --allow_version_labels_for_unavailable_models an existing
    label may not move to a version that is not available; the config is refused whole."""
    model_service = stub(two_versions.grpc_address, model_service_pb2_grpc.ModelServiceStub)
    reload = model_management_pb2.ReloadConfigRequest(config=labelled_config("specific", {"stable": 125, "canary": 124}))
    with pytest.raises(grpc.RpcError) as info:
        model_service.HandleReloadConfigRequest(reload, RPC_TIMEOUT)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details() == ("Request to assign label to version 125 of model default, which is not currently "
                                    "available for inference")
    assert predict_version(two_versions.grpc_address, version_label="stable") == 123


def test_a_network_reload_names_only_allowed_base_paths(two_versions):
    """loopline's rule (TF Serving has none): a config sent over the network may name only paths under
    serving.allowed_base_paths, by default the base paths of the config file the server started with."""
    config = labelled_config("all")
    config.model_config_list.config.add(name="other", base_path=str(HALF_PLUS_THREE), model_platform="tensorflow")
    model_service = stub(two_versions.grpc_address, model_service_pb2_grpc.ModelServiceStub)
    with pytest.raises(grpc.RpcError) as info:
        model_service.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(config=config), RPC_TIMEOUT)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED and "serving.allowed_base_paths" in info.value.details()
    assert predict_version(two_versions.grpc_address, version=124) == 124


def test_labels_at_start_up_without_the_flag_stop_the_server(tmp_path, capsys):
    """Without --allow_version_labels_for_unavailable_models TF Serving checks labels before the
    versions load, so a config file with labels does not start."""
    from pipeline.cli import main

    config = tmp_path / "models.config"
    config.write_text(str(labelled_config("specific", {"stable": 123})))
    code = main(["serve", f"--model_config_file={config}", "--port=0", f"--grpc_socket_path={tmp_path / 's'}"])
    assert code == 255
    assert ("Failed to start server. Error: FAILED_PRECONDITION: Request to assign label to version 123 of model "
            "default, which is not currently available for inference") in capsys.readouterr().err
