"""The PredictionService and ModelService logic on protos, shared by the gRPC and REST front ends."""
from __future__ import annotations

from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    predict_pb2,
    regression_pb2,
)

from serving.errors import invalid
from serving.manager import ModelManager
from serving.tensors import from_numpy, to_numpy

SIGNATURE_METADATA = "signature_def"


def _spec(response_spec, servable, signature_name: str) -> None:
    response_spec.name = servable.name
    response_spec.version.value = servable.version
    response_spec.signature_name = signature_name or "serving_default"


def predict(manager: ModelManager, request: predict_pb2.PredictRequest) -> predict_pb2.PredictResponse:
    spec = request.model_spec
    if not spec.name:
        raise invalid("model_spec.name is empty")
    with manager.resolve(spec) as servable:
        limit = manager.max_elements
        inputs = {name: to_numpy(t, name, limit) for name, t in request.inputs.items()}
        outputs = servable.run(spec.signature_name, inputs, request.output_filter)
        response = predict_pb2.PredictResponse()
        _spec(response.model_spec, servable, spec.signature_name)
        for name, array in outputs.items():
            from_numpy(array, response.outputs[name])
        return response


def classify(manager: ModelManager, request) -> classification_pb2.ClassificationResponse:
    return _run_examples(manager, request, classification_pb2.ClassificationResponse(), fill_classifications)


def _run_examples(manager: ModelManager, request, response, fill):
    """Classify and Regress: run the signature on the request's examples, fill the result."""
    with manager.resolve(request.model_spec) as servable:
        outputs = servable.run_examples(request.model_spec.signature_name, request.input)
        _spec(response.model_spec, servable, request.model_spec.signature_name)
        fill(response.result, outputs)
        return response


def fill_classifications(result, outputs) -> None:
    scores = outputs.get("scores")
    classes = outputs.get("classes")
    if scores is None and classes is None:
        raise invalid(f"the signature has no 'classes' or 'scores' output (outputs: {sorted(outputs)}); it is not a classifier")
    rows = (scores if scores is not None else classes).shape[0]
    # Reshaped once, not per element.
    scores = scores.reshape(rows, -1) if scores is not None else None
    classes = classes.reshape(rows, -1) if classes is not None else None
    width = (scores if scores is not None else classes).shape[1]
    for i in range(rows):
        item = result.classifications.add()
        for j in range(width):
            cls = item.classes.add()
            if classes is not None:
                label = classes[i, j]
                cls.label = label.decode() if isinstance(label, bytes) else str(label)
            if scores is not None:
                cls.score = float(scores[i, j])


def regress(manager: ModelManager, request) -> regression_pb2.RegressionResponse:
    return _run_examples(manager, request, regression_pb2.RegressionResponse(), fill_regressions)


def fill_regressions(result, outputs) -> None:
    values = outputs.get("outputs")
    if values is None:
        raise invalid(f"the signature has no 'outputs' output (outputs: {sorted(outputs)}); it is not a regressor")
    for v in values.reshape(values.shape[0], -1)[:, 0]:
        result.regressions.add(value=float(v))


def multi_inference(manager: ModelManager, request) -> inference_pb2.MultiInferenceResponse:
    response = inference_pb2.MultiInferenceResponse()
    if not request.tasks:
        raise invalid("MultiInference request has no tasks")
    for task in request.tasks:
        with manager.resolve(task.model_spec) as servable:
            outputs = servable.run_examples(task.model_spec.signature_name, request.input)
            result = response.results.add()
            _spec(result.model_spec, servable, task.model_spec.signature_name)
            if task.method_name == "tensorflow/serving/classify":
                fill_classifications(result.classification_result, outputs)
            elif task.method_name == "tensorflow/serving/regress":
                fill_regressions(result.regression_result, outputs)
            else:
                raise invalid(f"MultiInference task method {task.method_name!r}: expected tensorflow/serving/classify or regress")
    return response


def metadata(manager: ModelManager, request) -> get_model_metadata_pb2.GetModelMetadataResponse:
    fields = list(request.metadata_field)
    if fields != [SIGNATURE_METADATA]:
        raise invalid(f"metadata_field must be ['{SIGNATURE_METADATA}'], got {fields}")
    with manager.resolve(request.model_spec) as servable:
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = servable.name
        response.model_spec.version.value = servable.version
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        for name, sig in servable.signature_defs.items():
            signature_map.signature_def[name].CopyFrom(sig)
        response.metadata[SIGNATURE_METADATA].Pack(signature_map)
        return response


def model_status(manager: ModelManager, request) -> get_model_status_pb2.GetModelStatusResponse:
    spec = request.model_spec
    version = None
    if spec.WhichOneof("version_choice") == "version":
        version = spec.version.value
    elif spec.WhichOneof("version_choice") == "version_label":
        labels = manager.labels(spec.name)
        if spec.version_label not in labels:
            from serving.errors import not_found

            raise not_found(f"Unrecognized servable version label: {spec.version_label!r} for model {spec.name!r}")
        version = labels[spec.version_label]
    response = get_model_status_pb2.GetModelStatusResponse()
    states = get_model_status_pb2.ModelVersionStatus.State
    for v, state, error in manager.status(spec.name, version):
        row = response.model_version_status.add(version=v, state=states.Value(state))
        if error:
            row.status.error_code = 2  # UNKNOWN
            row.status.error_message = error
    return response
