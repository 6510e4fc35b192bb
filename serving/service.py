"""The PredictionService and ModelService logic on protos, shared by the gRPC and REST front ends
(and the warmup replay): one implementation of each API. The request rules are TF Serving's
(serving/rules.py); a request first resolves its model spec to a loaded version (the manager),
then runs on it (the `*_on` functions, which warmup calls directly, as TF Serving's warmup calls
RunPredict/RunClassify on the bundle being loaded); an answered request is handed to the request
log (serving/request_log.py), which samples it. Warmup replays are not: they go to `*_on`."""
from __future__ import annotations

from typing import Callable, Mapping

import grpc
import numpy as np
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_pb2,
    predict_pb2,
    regression_pb2,
)

from serving import rules
from serving import signature_names as names
from serving.errors import ServingError
from serving.request_limits import check_signature_shapes
from serving.tensors import from_numpy, to_numpy


def _model_spec(out: model_pb2.ModelSpec, servable, signature_name: str) -> None:
    """MakeModelSpec: the name, the signature ("" as serving_default) and the version that answered."""
    out.name = servable.name
    out.signature_name = rules.signature_key(signature_name)
    out.version.value = servable.version


# -- Predict ---------------------------------------------------------------------------------------
def run_predict(servable, signature_name: str, inputs: Mapping, output_filter, method_check: bool,
                parse: Callable | None = None) -> dict[str, np.ndarray]:
    """RunPredict on a loaded version: the signature, the inputs' names, then (`parse`: alias,
    value -> array, for protos) their values, the output filter, the call."""
    signature = rules.predict_signature(servable.signature_defs, signature_name, method_check)
    rules.check_predict_inputs(signature, inputs)
    if parse is not None:  # iterating a proto map by key: its items() view is Python code, several times slower
        inputs = {alias: parse(alias, inputs[alias]) for alias in inputs}
    if servable.limits.check_shapes:
        check_signature_shapes(servable.signature_shapes(signature_name), inputs)
    fetch = rules.output_aliases(signature, output_filter)
    return servable.run(rules.signature_key(signature_name), inputs, fetch)


def predict_on(servable, request: predict_pb2.PredictRequest, method_check: bool,
               tensor_content: bool = False) -> predict_pb2.PredictResponse:
    budget = servable.limits.budget()

    def parse(alias, proto):
        try:
            return to_numpy(proto, alias, budget)
        except ServingError as exc:
            if exc.code != grpc.StatusCode.INVALID_ARGUMENT:  # over a limit: said as it is
                raise
            raise rules.tensor_parsing_error(alias, exc.message) from None

    spec = request.model_spec
    outputs = run_predict(servable, spec.signature_name, request.inputs, request.output_filter, method_check, parse)
    response = predict_pb2.PredictResponse()
    _model_spec(response.model_spec, servable, spec.signature_name)
    for name, array in outputs.items():
        # TF Serving's default: typed value fields; --enable_serialization_as_tensor_content: bytes
        from_numpy(array, response.outputs[name], as_fields=not tensor_content)
    return response


def predict(manager, request: predict_pb2.PredictRequest) -> predict_pb2.PredictResponse:
    rules.require_model_spec(request)
    with manager.resolve(request.model_spec) as servable:
        response = predict_on(servable, request, manager.method_check, manager.options.tensor_content)
    manager.request_log.log(request, response)
    return response


# -- Classify and Regress --------------------------------------------------------------------------
def _run_examples(servable, signature_name: str, examples: np.ndarray, fetch: list[str]) -> dict[str, np.ndarray]:
    key = rules.signature_key(signature_name)
    return servable.run(key, {names.INPUTS: examples}, fetch)


def classify_on(servable, request, method_check: bool) -> classification_pb2.ClassificationResponse:
    """RunClassify: GetClassificationSignatureDef, PreProcess, the call, PostProcess."""
    name = request.model_spec.signature_name
    signature = rules.examples_signature(servable.signature_defs, name, names.CLASSIFY_METHOD, method_check)
    fetch = rules.classification_outputs(signature, method_check)
    examples = rules.serialized_examples(request.input, servable.limits.budget())
    response = classification_pb2.ClassificationResponse()
    _model_spec(response.model_spec, servable, name)
    rules.classifications(len(examples), _run_examples(servable, name, examples, fetch), response.result)
    return response


def regress_on(servable, request, method_check: bool) -> regression_pb2.RegressionResponse:
    """RunRegress: GetRegressionSignatureDef, PreProcess, the call, PostProcess."""
    name = request.model_spec.signature_name
    signature = rules.examples_signature(servable.signature_defs, name, names.REGRESS_METHOD, method_check)
    fetch = rules.regression_output(signature, method_check)
    examples = rules.serialized_examples(request.input, servable.limits.budget())
    response = regression_pb2.RegressionResponse()
    _model_spec(response.model_spec, servable, name)
    rules.regressions(len(examples), _run_examples(servable, name, examples, fetch), response.result)
    return response


def classify(manager, request) -> classification_pb2.ClassificationResponse:
    rules.require_model_spec(request)
    with manager.resolve(request.model_spec) as servable:
        response = classify_on(servable, request, manager.method_check)
    manager.request_log.log(request, response)
    return response


def regress(manager, request) -> regression_pb2.RegressionResponse:
    rules.require_model_spec(request)
    with manager.resolve(request.model_spec) as servable:
        response = regress_on(servable, request, manager.method_check)
    manager.request_log.log(request, response)
    return response


# -- MultiInference --------------------------------------------------------------------------------
def multi_inference_on(servable, request, method_check: bool) -> inference_pb2.MultiInferenceResponse:
    """TensorFlowMultiInferenceRunner::Infer: every task checked first, the examples run once per
    signature, each task's result post-processed."""
    tasks = rules.multi_inference_tasks(servable.signature_defs, request.tasks, method_check)
    examples = rules.serialized_examples(request.input, servable.limits.budget())
    response = inference_pb2.MultiInferenceResponse()
    for task, (key, method) in zip(request.tasks, tasks):
        result = response.results.add()
        signature = servable.signature_defs[key]
        if method == names.CLASSIFY_METHOD:
            outputs = _run_examples(servable, key, examples, rules.classification_outputs(signature, method_check))
            rules.classifications(len(examples), outputs, result.classification_result)
        else:
            outputs = _run_examples(servable, key, examples, rules.regression_output(signature, method_check))
            rules.regressions(len(examples), outputs, result.regression_result)
        _model_spec(result.model_spec, servable, task.model_spec.signature_name)
    return response


def multi_inference(manager, request) -> inference_pb2.MultiInferenceResponse:
    # RunMultiInferenceWithServerCore: the version comes from the first task's spec (none: no name).
    spec = request.tasks[0].model_spec if request.tasks else model_pb2.ModelSpec()
    with manager.resolve(spec) as servable:
        response = multi_inference_on(servable, request, manager.method_check)
    manager.request_log.log(request, response)
    return response


# -- GetModelMetadata, GetModelStatus --------------------------------------------------------------
def metadata(manager, request) -> get_model_metadata_pb2.GetModelMetadataResponse:
    rules.check_metadata_request(request)
    with manager.resolve(request.model_spec) as servable:
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = servable.name
        response.model_spec.version.value = servable.version
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        for name, signature in servable.all_signature_defs.items():
            signature_map.signature_def[name].CopyFrom(signature)
        response.metadata[rules.SIGNATURE_DEF_FIELD].Pack(signature_map)
        return response


def model_status(manager, request) -> get_model_status_pb2.GetModelStatusResponse:
    """GetModelStatusImpl: one version when the spec names one, else all (a label is ignored)."""
    rules.require_model_spec(request)
    spec = request.model_spec
    version = spec.version.value if spec.HasField("version") else None
    response = get_model_status_pb2.GetModelStatusResponse()
    states = get_model_status_pb2.ModelVersionStatus.State
    for v, state, code, error in manager.status(spec.name, version):
        row = response.model_version_status.add(version=v, state=states.Value(state))
        row.status.error_code = code.value[0]  # the load's own code, as TF Serving reports it
        row.status.error_message = error
    return response
