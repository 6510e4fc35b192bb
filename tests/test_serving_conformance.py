"""Conformance table: every error return of TF Serving's request paths (r2.19: classifier.cc,
regressor.cc, predict_util.cc, TensorFlow's saved_model/util.cc, multi_inference.cc,
get_model_metadata_impl.cc, get_model_status_impl.cc, model_service_impl.cc, server_core.cc,
http_rest_api_handler.cc and util/json_tensor.cc) is one row: a request through the stock
`tensorflow_serving.apis` stubs (or over REST), the status code, and TF Serving's message text
(exact, or its fixed beginning where the rest is a SignatureDef dump or a parser's detail).

One embedded server per method-name-check setting, in process, on free ports. A model `odd`
holds signatures built to break one rule each."""
from __future__ import annotations

import json
import re

import grpc
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
from serving.server import ModelServer
from tests.serving_helpers import add_version, example, export_model
from trainer.export import set_method_names

C = grpc.StatusCode
S = tf.TensorSpec([None], tf.string, name="inputs")
CLASSIFY, REGRESS, PREDICT = "tensorflow/serving/classify", "tensorflow/serving/regress", "tensorflow/serving/predict"


def _odd_model(path: str) -> None:
    """Signatures that each break one Classify/Regress rule (inputs are not parsed: only the
    batch size matters)."""
    n = lambda x: tf.shape(x)[0]
    strings = lambda x, width=2: tf.fill([n(x), width], "a")
    floats = lambda x, width=2, dtype=tf.float32: tf.zeros([n(x), width], dtype)
    functions = {
        "two_inputs": (lambda a, b: {"classes": strings(a)}, [tf.TensorSpec([None], tf.string, name="a"),
                                                               tf.TensorSpec([None], tf.string, name="b")]),
        "three_outputs": (lambda inputs: {"classes": strings(inputs), "scores": floats(inputs), "extra": floats(inputs)}, [S]),
        "wrong_input": (lambda x: {"scores": floats(x), "outputs": floats(x, 1)}, [tf.TensorSpec([None], tf.string, name="x")]),
        "no_class_outputs": (lambda inputs: {"foo": floats(inputs)}, [S]),
        "classes_1d": (lambda inputs: {"classes": tf.fill([n(inputs)], "a")}, [S]),
        "classes_int": (lambda inputs: {"classes": tf.zeros([n(inputs), 2], tf.int64)}, [S]),
        "scores_double": (lambda inputs: {"scores": floats(inputs, dtype=tf.float64)}, [S]),
        "scores_batch": (lambda inputs: {"scores": tf.zeros([1, 2])}, [S]),
        "width_mismatch": (lambda inputs: {"classes": strings(inputs, 2), "scores": floats(inputs, 3)}, [S]),
        "regress_two_outputs": (lambda inputs: {"outputs": floats(inputs, 1), "y": floats(inputs, 1)}, [S]),
        "regress_no_outputs": (lambda inputs: {"y": floats(inputs, 1)}, [S]),
        "regress_wrong_input": (lambda x: {"outputs": floats(x, 1)}, [tf.TensorSpec([None], tf.string, name="x")]),
        "regress_wide": (lambda inputs: {"outputs": floats(inputs, 2)}, [S]),
        "regress_double": (lambda inputs: {"outputs": floats(inputs, 1, tf.float64)}, [S]),
        "regress_batch": (lambda inputs: {"outputs": tf.zeros([1])}, [S]),
        "custom_method": (lambda inputs: {"scores": floats(inputs)}, [S]),
    }
    module = tf.Module()
    signatures = {}
    for name, (fn, spec) in functions.items():
        signatures[name] = tf.function(fn, input_signature=spec).get_concrete_function()
    tf.saved_model.save(module, path, signatures=signatures)
    set_method_names(path, {"custom_method": "custom/method"})


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("conformance") / "serving"
    add_version(root / "penguins", export_model(tmp_path_factory.mktemp("export") / "m"), 1)
    _odd_model(str(root / "odd" / "1"))
    write_serving_configs(str(root), ServingConfig(model_name="penguins"))
    write_serving_configs(str(root), ServingConfig(model_name="odd"))
    started = {}
    try:
        for check in (False, True):
            config = ServingConfig(grpc_port=0, rest_port=0, poll_seconds=3600, signature_method_name_check=check)
            started[check] = ModelServer(str(root), config).start()
        yield {check: (s, grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}")) for check, s in started.items()}
    finally:
        for server in started.values():
            server.stop(grace=0)


# -- request builders ------------------------------------------------------------------------------
def spec(request, name="penguins", signature=None, version=None, label=None):
    request.model_spec.name = name
    if signature is not None:
        request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    if label is not None:
        request.model_spec.version_label = label
    return request


def raw(signature="predict_raw", **kwargs):
    request = spec(predict_pb2.PredictRequest(), signature=signature, **kwargs)
    request.inputs["bill_length_mm"].CopyFrom(tf.make_tensor_proto([[40.0]], tf.float32))
    request.inputs["flipper_length_mm"].CopyFrom(tf.make_tensor_proto([[190.0]], tf.float32))
    request.inputs["island"].CopyFrom(tf.make_tensor_proto([[b"Dream"]]))
    return request


def edit(request, fn):
    fn(request)
    return request


def examples(request, count=2, **kwargs):
    request = spec(request, **kwargs)
    request.input.example_list.examples.extend(example() for _ in range(count))
    return request


def classify(count=2, **kwargs):
    return examples(classification_pb2.ClassificationRequest(), count, **kwargs)


def regress(count=2, **kwargs):
    return examples(regression_pb2.RegressionRequest(), count, **kwargs)


def multi(*tasks, count=1):
    request = inference_pb2.MultiInferenceRequest()
    request.input.example_list.examples.extend(example() for _ in range(count))
    for name, signature, method in tasks:
        task = request.tasks.add(method_name=method)
        task.model_spec.name = name
        task.model_spec.signature_name = signature
    return request


def metadata(fields=("signature_def",), **kwargs):
    return spec(get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=list(fields)), **kwargs)


def status(**kwargs):
    return spec(get_model_status_pb2.GetModelStatusRequest(), **kwargs)


def reload(root, *entries, kind="model_config_list"):
    config = model_server_config_pb2.ModelServerConfig()
    if kind != "model_config_list":
        config.custom_model_config.Pack(model_server_config_pb2.ModelServerConfig())
    for name, base, platform, labels in entries:
        entry = config.model_config_list.config.add(name=name, base_path=base.format(root=root), model_platform=platform)
        entry.version_labels.update(labels)
    return model_management_pb2.ReloadConfigRequest(config=config)


def content_of_wrong_size(request):
    request.inputs["bill_length_mm"].ClearField("float_val")
    request.inputs["bill_length_mm"].tensor_content = b"\x00" * 7


P, M = "prediction", "model"  # which service
# (id, method-name check, service, rpc, request (root -> proto), code, message: exact text, or a regex if it starts with ^)
GRPC_ROWS = [
    # ServerCore::GetServableHandle (server_core.cc, basic_manager.cc)
    ("no-model-spec", False, P, "Predict", lambda r: predict_pb2.PredictRequest(), C.INVALID_ARGUMENT, "Missing ModelSpec"),
    ("empty-model-name", False, P, "Predict", lambda r: raw(name=""), C.INVALID_ARGUMENT, "ModelSpec has no name specified."),
    ("unknown-model", False, P, "Predict", lambda r: raw(name="nope"), C.NOT_FOUND, "Servable not found for request: Latest(nope)"),
    ("unknown-version", False, P, "Predict", lambda r: raw(version=9), C.NOT_FOUND,
     "Servable not found for request: Specific(penguins, 9)"),
    ("unknown-label", False, P, "Predict", lambda r: raw(label="nope"), C.INVALID_ARGUMENT,
     "Unrecognized servable version label: nope"),
    # RunPredict, VerifySignature, VerifyRequestInputsSize (predict_util.cc), GetInputValues (saved_model/util.cc)
    ("predict-unknown-signature", False, P, "Predict", lambda r: raw(signature="nope"), C.FAILED_PRECONDITION,
     'Serving signature key "nope" not found.'),
    ("predict-method-name", True, P, "Predict", lambda r: spec(predict_pb2.PredictRequest(), "odd", "custom_method"),
     C.INTERNAL, "Expected prediction signature method_name to be one of {tensorflow/serving/predict, "
                 "tensorflow/serving/classify, tensorflow/serving/regress}. Was: custom/method"),
    ("predict-extra-input", False, P, "Predict",
     lambda r: edit(raw(), lambda q: q.inputs["x"].CopyFrom(tf.make_tensor_proto([1.0]))), C.INVALID_ARGUMENT,
     "input size does not match signature: 4!=3 len({bill_length_mm,flipper_length_mm,island,x}) != "
     "len({bill_length_mm,flipper_length_mm,island}). Sent extra: {x}. Missing but required: {}."),
    ("predict-missing-input", False, P, "Predict", lambda r: edit(raw(), lambda q: q.inputs.pop("island")),
     C.INVALID_ARGUMENT, "input size does not match signature: 2!=3 len({bill_length_mm,flipper_length_mm}) != "
                         "len({bill_length_mm,flipper_length_mm,island}). Sent extra: {}. Missing but required: {island}."),
    ("predict-misnamed-input", False, P, "Predict",
     lambda r: edit(raw(), lambda q: (q.inputs["x"].CopyFrom(q.inputs["island"]), q.inputs.pop("island"))),
     C.INVALID_ARGUMENT, "Signature input alias: island(feed name: predict_raw_island:0) not found in request and no "
                         "default value provided. Inputs expected to be in the request {bill_length_mm,flipper_length_mm,x}, "
                         "or default input alias set: "),
    ("predict-tensor-parsing", False, P, "Predict", lambda r: edit(raw(), content_of_wrong_size), C.INVALID_ARGUMENT,
     r"^tensor parsing error: bill_length_mm \("),
    ("predict-unknown-output-filter", False, P, "Predict", lambda r: edit(raw(), lambda q: q.output_filter.append("nope")),
     C.INVALID_ARGUMENT, "output tensor alias not found in signature: nope Outputs expected to be in the set "
                         "{body_mass_g,classes,scores}."),
    ("predict-duplicate-output-filter", False, P, "Predict",
     lambda r: edit(raw(), lambda q: q.output_filter.extend(["scores", "scores"])), C.INVALID_ARGUMENT,
     "duplicate output tensor alias: scores"),
    ("predict-wrong-dtype", False, P, "Predict",  # Session::Run's own check (FunctionCallFrame::SetArgs)
     lambda r: edit(raw(), lambda q: q.inputs["bill_length_mm"].CopyFrom(tf.make_tensor_proto([[b"x"]]))),
     C.INVALID_ARGUMENT, "Expects arg[0] to be float but string is provided"),
    # RunClassify: GetClassificationSignatureDef, PreProcessClassification, PostProcessClassificationResult (classifier.cc)
    ("classify-no-model-spec", False, P, "Classify", lambda r: classification_pb2.ClassificationRequest(),
     C.INVALID_ARGUMENT, "Missing ModelSpec"),
    ("classify-unknown-signature", False, P, "Classify", lambda r: classify(signature="nope"), C.INVALID_ARGUMENT,
     "No signature was found with the name: nope"),
    ("classify-method-name", True, P, "Classify", lambda r: classify(signature="regress_body_mass_g"), C.INVALID_ARGUMENT,
     f"Expected classification signature method_name to be {CLASSIFY}. Was: {REGRESS}"),
    ("classify-one-input", False, P, "Classify", lambda r: classify(name="odd", signature="two_inputs"),
     C.INVALID_ARGUMENT, "Expected one input Tensor."),
    ("classify-one-or-two-outputs", False, P, "Classify", lambda r: classify(signature="predict"), C.INVALID_ARGUMENT,
     "Expected one or two output Tensors, found 3"),
    ("classify-inputs-name", False, P, "Classify", lambda r: classify(name="odd", signature="wrong_input"),
     C.INVALID_ARGUMENT, r"^No classification inputs found in SignatureDef: inputs \{"),
    ("classify-outputs-names", False, P, "Classify", lambda r: classify(name="odd", signature="no_class_outputs"),
     C.INVALID_ARGUMENT, r'^Expected classification signature outputs to contain at least one of "classes" or '
                         r'"scores"\. Signature was: inputs \{'),
    ("classify-empty-input", False, P, "Classify", lambda r: classify(count=0), C.INVALID_ARGUMENT, "Input is empty."),
    ("classify-classes-rank", False, P, "Classify", lambda r: classify(name="odd", signature="classes_1d"),
     C.INVALID_ARGUMENT, "Expected Tensor shape: [batch_size num_classes] but got [2]"),
    ("classify-classes-dtype", False, P, "Classify", lambda r: classify(name="odd", signature="classes_int"),
     C.INVALID_ARGUMENT, "Expected classes Tensor of DT_STRING. Got: DT_INT64"),
    ("classify-scores-dtype", False, P, "Classify", lambda r: classify(name="odd", signature="scores_double"),
     C.INVALID_ARGUMENT, "Expected scores Tensor of DT_FLOAT. Got: DT_DOUBLE"),
    ("classify-batch-size", False, P, "Classify", lambda r: classify(name="odd", signature="scores_batch"),
     C.INVALID_ARGUMENT, "Expected scores output batch size of 2. Got: 1"),
    ("classify-classes-scores-width", False, P, "Classify", lambda r: classify(name="odd", signature="width_mismatch"),
     C.INVALID_ARGUMENT, "Tensors class and score should match in dim_size(1). Got 2 vs. 3"),
    # RunRegress: GetRegressionSignatureDef, PreProcessRegression, PostProcessRegressionResult (regressor.cc)
    ("regress-no-model-spec", False, P, "Regress", lambda r: regression_pb2.RegressionRequest(), C.INVALID_ARGUMENT,
     "Missing ModelSpec"),
    ("regress-unknown-signature", False, P, "Regress", lambda r: regress(signature="nope"), C.INVALID_ARGUMENT,
     "No signature was found with the name: nope"),
    ("regress-method-name", True, P, "Regress", lambda r: regress(signature="classify_species"), C.INVALID_ARGUMENT,
     f"Expected regression signature method_name to be {REGRESS}. Was: {CLASSIFY}"),
    ("regress-one-input", False, P, "Regress", lambda r: regress(name="odd", signature="two_inputs"), C.INVALID_ARGUMENT,
     "Expected one input Tensor."),
    ("regress-one-output", False, P, "Regress", lambda r: regress(), C.INVALID_ARGUMENT, "Expected one output Tensor."),
    ("regress-inputs-name", False, P, "Regress", lambda r: regress(name="odd", signature="regress_wrong_input"),
     C.INVALID_ARGUMENT, r"^No regression inputs found in SignatureDef: inputs \{"),
    ("regress-outputs-name", False, P, "Regress", lambda r: regress(name="odd", signature="regress_no_outputs"),
     C.INVALID_ARGUMENT, r"^No regression outputs found in SignatureDef: inputs \{"),
    ("regress-empty-input", False, P, "Regress", lambda r: regress(count=0, signature="regress_body_mass_g"),
     C.INVALID_ARGUMENT, "Input is empty."),
    ("regress-output-shape", False, P, "Regress", lambda r: regress(name="odd", signature="regress_wide"),
     C.INVALID_ARGUMENT, "Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got [2,2]"),
    ("regress-batch-size", False, P, "Regress", lambda r: regress(name="odd", signature="regress_batch"),
     C.INVALID_ARGUMENT, "Input batch size did not match output batch size: 2 vs. 1"),
    ("regress-output-dtype", False, P, "Regress", lambda r: regress(name="odd", signature="regress_double"),
     C.INVALID_ARGUMENT, "Expected output Tensor of DT_FLOAT.  Got: DT_DOUBLE"),
    # RunMultiInference (multi_inference.cc, multi_inference_helper.cc)
    ("multi-no-tasks", False, P, "MultiInference", lambda r: multi(), C.INVALID_ARGUMENT, "ModelSpec has no name specified."),
    ("multi-empty-name", False, P, "MultiInference",
     lambda r: multi(("penguins", "", CLASSIFY), ("", "regress_body_mass_g", REGRESS)), C.INVALID_ARGUMENT,
     "Found ModelSpec with an empty model name."),
    ("multi-same-model", False, P, "MultiInference",
     lambda r: multi(("penguins", "", CLASSIFY), ("odd", "regress_wide", REGRESS)), C.INVALID_ARGUMENT,
     "All ModelSpecs in a MultiInferenceRequest must access the same model name."),
    ("multi-duplicate-signature", False, P, "MultiInference",
     lambda r: multi(("penguins", "", CLASSIFY), ("penguins", "serving_default", CLASSIFY)), C.INVALID_ARGUMENT,
     "Duplicate evaluation of signature: serving_default"),
    ("multi-unknown-signature", False, P, "MultiInference", lambda r: multi(("penguins", "nope", CLASSIFY)),
     C.INVALID_ARGUMENT, "Requested signature not found in model graph: nope"),
    ("multi-method", False, P, "MultiInference", lambda r: multi(("penguins", "predict", PREDICT)), C.UNIMPLEMENTED,
     f"Unsupported signature method_name: {PREDICT}"),
    ("multi-checks-each-task", False, P, "MultiInference",
     lambda r: multi(("penguins", "", CLASSIFY), ("penguins", "classify_species", REGRESS)), C.INVALID_ARGUMENT,
     "Expected one output Tensor."),
    ("multi-empty-input", False, P, "MultiInference", lambda r: multi(("penguins", "", CLASSIFY), count=0),
     C.INVALID_ARGUMENT, "Input is empty."),
    # GetModelMetadataImpl (get_model_metadata_impl.cc)
    ("metadata-no-model-spec", False, P, "GetModelMetadata",
     lambda r: get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"]), C.INVALID_ARGUMENT,
     "Missing ModelSpec"),
    ("metadata-no-field", False, P, "GetModelMetadata", lambda r: metadata(fields=()), C.INVALID_ARGUMENT,
     "GetModelMetadataRequest must specify at least one metadata_field"),
    ("metadata-unsupported-field", False, P, "GetModelMetadata", lambda r: metadata(fields=("nope",)),
     C.INVALID_ARGUMENT, "Metadata field nope is not supported"),
    ("metadata-unknown-model", False, P, "GetModelMetadata", lambda r: metadata(name="nope"), C.NOT_FOUND,
     "Servable not found for request: Latest(nope)"),
    # GetModelStatusImpl (get_model_status_impl.cc)
    ("status-no-model-spec", False, M, "GetModelStatus", lambda r: get_model_status_pb2.GetModelStatusRequest(),
     C.INVALID_ARGUMENT, "Missing ModelSpec"),
    ("status-unknown-model", False, M, "GetModelStatus", lambda r: status(name="nope"), C.NOT_FOUND,
     "Could not find any versions of model nope"),
    ("status-unknown-version", False, M, "GetModelStatus", lambda r: status(version=9), C.NOT_FOUND,
     "Could not find version 9 of model penguins"),
    # HandleReloadConfigRequest (model_service_impl.cc, server_core.cc)
    ("reload-config-kind", False, M, "HandleReloadConfigRequest", lambda r: reload(r, kind="custom"), C.INVALID_ARGUMENT,
     "ServerModelConfig type not supported by HandleReloadConfigRequest. Only ModelConfigList is currently supported"),
    ("reload-duplicate-model", False, M, "HandleReloadConfigRequest",
     lambda r: reload(r, ("penguins", "{root}/penguins", "tensorflow", {}), ("penguins", "{root}/penguins", "tensorflow", {})),
     C.INVALID_ARGUMENT, "Illegal to list model penguins multiple times in config list"),
    ("reload-relative-path", False, M, "HandleReloadConfigRequest",
     lambda r: reload(r, ("penguins", "penguins", "tensorflow", {})), C.INVALID_ARGUMENT,
     "Expected model penguins to have an absolute path or URI; got base_path()=penguins"),
    ("reload-no-platform", False, M, "HandleReloadConfigRequest", lambda r: reload(r, ("penguins", "{root}/penguins", "", {})),
     C.INVALID_ARGUMENT, "Illegal setting neither ModelServerConfig::model_type (deprecated) nor "
                         "ModelServerConfig::model_platform, model name is penguins"),
    ("reload-unknown-platform", False, M, "HandleReloadConfigRequest",
     lambda r: reload(r, ("penguins", "{root}/penguins", "tflite", {})), C.FAILED_PRECONDITION,
     "PlatformConfigMap has no entry for platform tflite"),
    ("reload-label-unavailable-version", False, M, "HandleReloadConfigRequest",
     lambda r: reload(r, ("penguins", "{root}/penguins", "tensorflow", {"stable": 9}), ("odd", "{root}/odd", "tensorflow", {})),
     C.FAILED_PRECONDITION, "Request to assign label to version 9 of model penguins, which is not currently available for inference"),
]


def _matches(message: str, expected: str) -> bool:
    return re.match(expected, message, re.S) is not None if expected.startswith("^") else message == expected


@pytest.mark.parametrize("row", GRPC_ROWS, ids=[r[0] for r in GRPC_ROWS])
def test_grpc_rule(servers, row):
    _, check, service, rpc, build, code, expected = row
    server, channel = servers[check]
    stub = (prediction_service_pb2_grpc.PredictionServiceStub if service == P else model_service_pb2_grpc.ModelServiceStub)(channel)
    root = server.manager.serving_root
    with pytest.raises(grpc.RpcError) as info:
        getattr(stub, rpc)(build(root), timeout=30)
    assert info.value.code() == code and _matches(info.value.details(), expected), (info.value.code(), info.value.details())


# The gRPC rows that have a REST form: Classify and Regress over :classify/:regress with the same
# examples as JSON, and the model-spec rows over :predict, answering the same text.
_EXAMPLE_JSON = {"bill_length_mm": 40.0, "flipper_length_mm": 190, "island": "Dream"}
_HTTP = {C.INVALID_ARGUMENT: 400, C.NOT_FOUND: 404, C.FAILED_PRECONDITION: 400}
REST_FORMS = [r for r in GRPC_ROWS if (r[3] in ("Classify", "Regress") and "no-model-spec" not in r[0]
                                        and "empty-input" not in r[0])
              or r[0] in ("unknown-model", "unknown-version", "unknown-label")]


def _rest_form(request, rpc: str) -> tuple[str, dict]:
    spec = request.model_spec
    path = f"/v1/models/{spec.name}"
    if spec.HasField("version"):
        path += f"/versions/{spec.version.value}"
    elif spec.version_label:
        path += f"/labels/{spec.version_label}"
    if rpc == "Predict":
        return f"{path}:predict", {"signature_name": spec.signature_name, "instances": [{k: [v] for k, v in _EXAMPLE_JSON.items()}]}
    body = {"examples": [_EXAMPLE_JSON] * len(request.input.example_list.examples)}
    if spec.signature_name:
        body["signature_name"] = spec.signature_name
    return f"{path}:{rpc.lower()}", body


@pytest.mark.parametrize("row", REST_FORMS, ids=[r[0] for r in REST_FORMS])
def test_grpc_rule_over_rest(servers, row):
    _, check, _, rpc, build, code, expected = row
    server, _ = servers[check]
    path, body = _rest_form(build(server.manager.serving_root), rpc)
    response = requests.post(f"http://127.0.0.1:{server.rest_port}{path}", json=body, timeout=30)
    assert response.status_code == _HTTP[code] and _matches(response.json()["error"], expected), response.text


def test_method_name_rows_pass_with_the_check_off(servers):
    """The rows that need --enable_signature_method_name_check answer without it, as TF Serving does."""
    _, channel = servers[False]
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    custom = spec(predict_pb2.PredictRequest(), "odd", "custom_method")
    custom.inputs["inputs"].CopyFrom(tf.make_tensor_proto([b"x", b"y"]))
    assert tf.make_ndarray(stub.Predict(custom, timeout=30).outputs["scores"]).shape == (2, 2)
    assert len(stub.Regress(regress(signature="regress_body_mass_g"), timeout=30).result.regressions) == 2
    answer = stub.Classify(classify(signature="classify_species"), timeout=30)
    assert [c.label for c in answer.result.classifications[0].classes] == ["Adelie", "Chinstrap", "Gentoo"]
    assert answer.model_spec.signature_name == "classify_species" and answer.model_spec.version.value == 1
    with pytest.raises(grpc.RpcError) as info:  # without the check, Regress still needs one output
        stub.Regress(regress(signature="classify_species"), timeout=30)
    assert info.value.details() == "Expected one output Tensor."


def test_predict_answers_in_typed_fields_as_tf_serving(servers):
    """Tensor::AsProtoField, TF Serving's default: values in float_val/string_val, not tensor_content."""
    _, channel = servers[False]
    response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(raw(), timeout=30)
    assert len(response.outputs["scores"].float_val) == 3 and not response.outputs["scores"].tensor_content
    assert list(response.outputs["classes"].string_val) == [b"Adelie", b"Chinstrap", b"Gentoo"]
    assert response.model_spec.signature_name == "predict_raw"


ROW = {"bill_length_mm": [40.0], "flipper_length_mm": [190.0], "island": ["Dream"]}
RAW = "/v1/models/penguins:predict"
# (id, method, path, body (bytes, or JSON-able), HTTP status, message: exact, or a regex if it starts with ^)
REST_ROWS = [
    ("malformed-verb", "POST", "/v1/models/penguins:explain", {}, 400, "Malformed request: POST /v1/models/penguins:explain"),
    ("verb-case", "POST", "/v1/models/penguins:PREDICT", {}, 400, "Malformed request: POST /v1/models/penguins:PREDICT"),
    ("missing-model-name", "GET", "/v1/models", None, 400, "Missing model name in request."),
    ("version-not-an-int64", "GET", "/v1/models/penguins/versions/99999999999999999999", None, 400,
     "Failed to convert version: 99999999999999999999 to numeric."),
    ("unknown-model", "POST", "/v1/models/nope:predict", {"instances": [1]}, 404, "Servable not found for request: Latest(nope)"),
    ("unknown-label", "GET", "/v1/models/penguins/labels/nope/metadata", None, 400, "Unrecognized servable version label: nope"),
    ("status-unknown-version", "GET", "/v1/models/penguins/versions/9", None, 404, "Could not find version 9 of model penguins"),
    ("metadata-unknown-model", "GET", "/v1/models/nope/metadata", None, 404, "Servable not found for request: Latest(nope)"),
    # ParseJson, FillSignature, FillPredictRequestFromJson, FillTensorMapFrom* (json_tensor.cc)
    ("empty-body", "POST", RAW, b"", 400, "JSON Parse error: The document is empty"),
    ("not-json", "POST", RAW, b"{not json", 400, r"^JSON Parse error: .* at offset: \d+"),
    ("not-an-object", "POST", RAW, [1], 400, "JSON Value: [1] Is not object"),
    ("signature-not-a-string", "POST", RAW, {"signature_name": 1, "instances": [1]}, 400,
     "JSON Value: {\"signature_name\":1,\"instances\":[1]} not formatted correctly. 'signature_name' key must be a string value."),
    ("unknown-signature", "POST", RAW, {"signature_name": "nope", "instances": [1]}, 400,
     'Serving signature name: "nope" not found in signature def'),
    ("instances-and-inputs", "POST", RAW, {"signature_name": "predict_raw", "instances": [ROW], "inputs": ROW}, 400,
     r"^JSON Value: .* Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist $"),
    ("instances-not-a-list", "POST", RAW, {"instances": 1}, 400, "JSON Value: {\"instances\":1} Expecting 'instances' to be an list/array"),
    ("instances-empty", "POST", RAW, {"instances": []}, 400, "JSON Value: {\"instances\":[]} No values in 'instances' array"),
    ("no-instances-or-inputs", "POST", RAW, {"signature_name": "predict_raw"}, 400, "Missing 'inputs' or 'instances' key"),
    ("instances-plain-for-many-inputs", "POST", RAW, {"signature_name": "predict_raw", "instances": [[1.0]]}, 400,
     "instances is a plain list, but expecting list of objects as multiple input tensors required as per tensorinfo_map"),
    ("instances-keys", "POST", RAW, {"signature_name": "predict_raw", "instances": [{"bill_length_mm": [1.0]}]}, 400,
     "Failed to process element: 0 of 'instances' list. JSON object: {\"bill_length_mm\":[1.0]} keys must be equal to: "
     "bill_length_mm,flipper_length_mm,island"),
    ("instances-object-then-list", "POST", RAW, {"signature_name": "predict_raw", "instances": [ROW, [1.0]]}, 400,
     "Expecting object but got list at item 1 of input list"),
    ("instances-unknown-key", "POST", RAW, {"signature_name": "predict_raw", "instances": [{**ROW, "x": [1.0]}]}, 400,
     "Failed to process element: 0 key: x of 'instances' list. Error: INVALID_ARGUMENT: JSON object: does not have named input: x"),
    ("instances-shapes-differ", "POST", RAW,
     {"signature_name": "predict_raw", "instances": [ROW, {**ROW, "bill_length_mm": 1.0}]}, 400,
     "Failed to process element: 1 key: bill_length_mm of 'instances' list. Error: INVALID_ARGUMENT: Expecting shape [1] but got: []"),
    ("instances-sizes-differ", "POST", RAW,
     {"signature_name": "predict_raw", "instances": [ROW, {**ROW, "bill_length_mm": [1.0, 2.0]}]}, 400,
     "Failed to process element: 1 key: bill_length_mm of 'instances' list. Error: INVALID_ARGUMENT: Expecting tensor size: 1 but got: 2"),
    ("inputs-plain-for-many-inputs", "POST", RAW, {"signature_name": "predict_raw", "inputs": [[1.0]]}, 400,
     "inputs is a plain value/list, but expecting an object as multiple input tensors required as per tensorinfo_map"),
    ("inputs-missing-name", "POST", RAW, {"signature_name": "predict_raw", "inputs": {"bill_length_mm": [[1.0]]}}, 400,
     "Missing named input: flipper_length_mm in 'inputs' object."),
    ("value-type", "POST", RAW, {"signature_name": "predict_raw", "inputs": {**ROW, "bill_length_mm": [["x"]]}}, 400,
     'JSON Value: "x" Type: String is not of expected type: float'),
    ("ragged-list", "POST", RAW, {"signature_name": "predict_raw", "inputs": {**ROW, "bill_length_mm": [[1.0], [1.0, 2.0]]}}, 400,
     "Encountered list at unexpected size: 2 at level: 1 expected size: 1"),
    ("value-too-deep", "POST", RAW, {"signature_name": "predict_raw", "inputs": {**ROW, "bill_length_mm": [1.0, [2.0]]}}, 400,
     "Encountered list at unexpected level: 1 expected < 1"),
    ("value-too-shallow", "POST", RAW, {"signature_name": "predict_raw", "inputs": {**ROW, "bill_length_mm": [[1.0], 2.0]}}, 400,
     "JSON Value: 2.0 found at incorrect level: 2 in the JSON DOM. Expected at level: 2"),
    ("bad-base64", "POST", "/v1/models/penguins:predict", {"instances": [{"b64": "%%%"}]}, 400,
     "Failed to process element: 0 of 'instances' list. Error: INVALID_ARGUMENT: Unable to base64 decode"),
    # FillClassifyRegressRequestFromJson, MakeExampleFromJsonObject, AddValueToFeature (json_tensor.cc)
    ("examples-missing", "POST", "/v1/models/penguins:classify", {"context": {}}, 400,
     "JSON Value: {\"context\":{}} When method is classify, key 'examples' is expected and was not found"),
    ("examples-not-a-list", "POST", "/v1/models/penguins:regress", {"examples": {}}, 400,
     "JSON Value: {\"examples\":{}} Expecting 'examples' value to be an list/array"),
    ("examples-empty", "POST", "/v1/models/penguins:classify", {"examples": []}, 400,
     "JSON Value: {\"examples\":[]} 'examples' value is an empty array"),
    ("example-not-an-object", "POST", "/v1/models/penguins:classify", {"examples": [[1]]}, 400,
     "Example must be JSON object but got JSON Array"),
    ("feature-null", "POST", "/v1/models/penguins:classify", {"examples": [{"island": None}]}, 400,
     "Feature: island has element with unexpected JSON type: Null"),
    ("feature-nested-list", "POST", "/v1/models/penguins:classify", {"examples": [{"island": [["a"]]}]}, 400,
     "Feature: island has element with unexpected JSON type: Array"),
    ("feature-mixed-kinds", "POST", "/v1/models/penguins:classify", {"examples": [{"bill_length_mm": [1.5, "a"]}]}, 400,
     "Unexpected element type in feature: bill_length_mm expecting type: float"),
    ("feature-uint64", "POST", "/v1/models/penguins:classify", {"examples": [{"flipper_length_mm": 2**63}]}, 400,
     "Feature: flipper_length_mm has uint64_t element. Only int64_t is supported."),
    # A whole number is an int64 feature whatever the model expects: the model's parser refuses it.
    ("feature-kind-is-not-coerced", "POST", "/v1/models/penguins:classify",
     {"examples": [{"bill_length_mm": 40, "flipper_length_mm": 190, "island": "Dream"}]}, 400, r"^.*bill_length_mm"),
    ("classify-rule-over-rest", "POST", "/v1/models/penguins:regress", {"examples": [{"island": "Dream"}]}, 400,
     "Expected one output Tensor."),
]


@pytest.mark.parametrize("row", REST_ROWS, ids=[r[0] for r in REST_ROWS])
def test_rest_rule(servers, row):
    _, method, path, body, http_status, expected = row
    server, _ = servers[False]
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    response = requests.request(method, f"http://127.0.0.1:{server.rest_port}{path}", data=data, timeout=30)
    assert response.status_code == http_status, response.text
    assert list(response.json()) == ["error"] and _matches(response.json()["error"], expected), response.json()


def test_rest_answers_follow_the_rest_api_document(servers):
    server, _ = servers[False]
    url = f"http://127.0.0.1:{server.rest_port}/v1/models/penguins"
    assert requests.get(url, timeout=30).json() == {"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}
    row = requests.post(f"{url}:predict", json={"signature_name": "predict_raw", "instances": [ROW, ROW]}, timeout=30).json()
    assert [sorted(p) for p in row["predictions"]] == [["body_mass_g", "classes", "scores"]] * 2
    one = requests.post(f"{url}:predict", json={"signature_name": "predict_raw", "instances": [ROW],
                                                 "output_filter": ["scores"]}, timeout=30).json()
    assert len(one["predictions"][0]) == 3  # output_filter is not part of the REST API: every output comes back
    columnar = requests.post(f"{url}:predict", json={"signature_name": "predict_raw", "inputs": ROW | {
        "bill_length_mm": [[40.0]], "flipper_length_mm": [[190.0]], "island": [["Dream"]]}}, timeout=30).json()
    assert columnar["outputs"]["classes"] == [["Adelie", "Chinstrap", "Gentoo"]]
    single = requests.post(f"{url}:predict", json={"instances": [{"b64": __import__("base64").b64encode(
        example().SerializeToString()).decode()}]}, timeout=30).json()  # serving_default: one input, b64 bytes
    assert single["predictions"][0]["classes"] == ["Adelie", "Chinstrap", "Gentoo"]
    classified = requests.post(f"{url}:classify", json={"examples": [{"bill_length_mm": 40.0, "flipper_length_mm": 190,
                                                                      "island": "Dream"}]}, timeout=30).json()
    assert list(classified) == ["results"] and [c[0] for c in classified["results"][0]] == ["Adelie", "Chinstrap", "Gentoo"]
    assert abs(sum(c[1] for c in classified["results"][0]) - 1) < 1e-5
