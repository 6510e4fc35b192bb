"""TF Serving's request rules as pure functions, with its status codes and message texts.

Taken from the r2.19 sources (tensorflow-serving-api 2.19.1 is locked): predict_util.cc
(VerifySignature, VerifyRequestInputsSize, PreProcessPrediction), TensorFlow's
saved_model/util.cc (GetInputValues), classifier.cc and regressor.cc (Get*SignatureDef,
PreProcess*, PostProcess*Result), util.cc (InputToSerializedExampleTensor), multi_inference.cc,
get_model_metadata_impl.cc and server_core.cc. Each function names the one it mirrors. The
method-name checks apply only when the server runs with the check on (TF Serving's
--enable_signature_method_name_check, off by default).
"""
from __future__ import annotations

import grpc
import numpy as np
from google.protobuf import text_format
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import input_pb2

from serving import signature_names as names
from serving.errors import ServingError, invalid
from serving.request_limits import ElementBudget
from serving.tensors import numpy_dtype_enum

_PREDICT_METHODS = (names.PREDICT_METHOD, names.CLASSIFY_METHOD, names.REGRESS_METHOD)
_MAX_LISTED_INPUTS = 1000


def _set(keys) -> str:
    """absl::StrJoin of a std::set<string>: sorted, comma separated."""
    return ",".join(sorted(keys))


def _debug(signature) -> str:
    return text_format.MessageToString(signature)


def signature_key(name: str) -> str:
    return name or names.DEFAULT


# -- Predict (predict_util.cc, saved_model/util.cc) ------------------------------------------------
def predict_signature(signature_defs, name: str, method_check: bool):
    """RunPredict's lookup and VerifySignature."""
    key = signature_key(name)
    signature = signature_defs.get(key)
    if signature is None:
        raise ServingError(grpc.StatusCode.FAILED_PRECONDITION, f'Serving signature key "{key}" not found.')
    if method_check and signature.method_name not in _PREDICT_METHODS:
        raise ServingError(grpc.StatusCode.INTERNAL,
                           f"Expected prediction signature method_name to be one of {{{', '.join(_PREDICT_METHODS)}}}. "
                           f"Was: {signature.method_name}")
    return signature


def check_predict_inputs(signature, request_inputs) -> None:
    """VerifyRequestInputsSize, then GetInputValues' name checks (signature defaults are not
    supported by TF2 exports: none are read). Names are listed as TF Serving lists them, unless
    there are too many to hold as Python strings (a request may carry millions)."""
    if len(request_inputs) > len(signature.inputs) + _MAX_LISTED_INPUTS:
        raise invalid(f"input size does not match signature: {len(request_inputs)}!={len(signature.inputs)} "
                      f"(too many inputs to list; expected {{{_set(signature.inputs)}}})")
    sent, wanted = set(request_inputs), set(signature.inputs)
    if len(sent) > len(wanted) or (len(sent) < len(wanted) and not signature.defaults):
        raise invalid(f"input size does not match signature: {len(sent)}!={len(wanted)} len({{{_set(sent)}}}) != "
                      f"len({{{_set(wanted)}}}). Sent extra: {{{_set(sent - wanted)}}}. "
                      f"Missing but required: {{{_set(wanted - sent)}}}.")
    for alias in sorted(wanted - sent):
        if alias not in signature.defaults:
            raise invalid(f"Signature input alias: {alias}(feed name: {signature.inputs[alias].name}) not found in request "
                          f"and no default value provided. Inputs expected to be in the request {{{_set(sent)}}}, "
                          f"or default input alias set: {_set(signature.defaults)}")
    if sent - wanted:
        raise invalid(f"Inputs contains invalid name. Used request inputs: {_set(sent & wanted)}, "
                      f"request input: {_set(sent)}")


def tensor_parsing_error(alias: str, detail: str) -> ServingError:
    """GetInputValues: Tensor::FromProto failed (the detail is ours)."""
    return invalid(f"tensor parsing error: {alias} ({detail})")


def output_aliases(signature, output_filter) -> list[str]:
    """PreProcessPrediction's output filter; no filter: every output."""
    seen = []
    for alias in output_filter:
        if alias not in signature.outputs:
            raise invalid(f"output tensor alias not found in signature: {alias} Outputs expected to be in the set "
                          f"{{{_set(signature.outputs)}}}.")
        if alias in seen:
            raise invalid(f"duplicate output tensor alias: {alias}")
        seen.append(alias)
    return seen or list(signature.outputs)


# -- Classify and Regress (classifier.cc, regressor.cc) --------------------------------------------
def _method_check(signature, method: str, what: str, method_check: bool) -> None:
    if method_check and signature.method_name != method:
        raise invalid(f"Expected {what} signature method_name to be {method}. Was: {signature.method_name}")


def examples_signature(signature_defs, name: str, method: str, method_check: bool):
    """GetClassificationSignatureDef / GetRegressionSignatureDef, then PreProcess*."""
    key = signature_key(name)
    signature = signature_defs.get(key)
    if signature is None:
        raise invalid(f"No signature was found with the name: {key}")
    if method == names.CLASSIFY_METHOD:
        classification_outputs(signature, method_check)
    else:
        regression_output(signature, method_check)
    return signature


def classification_outputs(signature, method_check: bool) -> list[str]:
    """PreProcessClassification: the outputs to fetch (`classes` and/or `scores`)."""
    _method_check(signature, names.CLASSIFY_METHOD, "classification", method_check)
    if len(signature.inputs) != 1:
        raise invalid("Expected one input Tensor.")
    if len(signature.outputs) not in (1, 2):
        raise invalid(f"Expected one or two output Tensors, found {len(signature.outputs)}")
    if names.INPUTS not in signature.inputs:
        raise invalid(f"No classification inputs found in SignatureDef: {_debug(signature)}")
    fetch = [o for o in (names.CLASSES, names.SCORES) if o in signature.outputs]
    if not fetch:
        raise invalid(f'Expected classification signature outputs to contain at least one of "{names.CLASSES}" or '
                      f'"{names.SCORES}". Signature was: {_debug(signature)}')
    return fetch


def regression_output(signature, method_check: bool) -> list[str]:
    """PreProcessRegression: the output to fetch (`outputs`)."""
    _method_check(signature, names.REGRESS_METHOD, "regression", method_check)
    if len(signature.inputs) != 1:
        raise invalid("Expected one input Tensor.")
    if len(signature.outputs) != 1:
        raise invalid("Expected one output Tensor.")
    if names.INPUTS not in signature.inputs:
        raise invalid(f"No regression inputs found in SignatureDef: {_debug(signature)}")
    if names.OUTPUTS not in signature.outputs:
        raise invalid(f"No regression outputs found in SignatureDef: {_debug(signature)}")
    return [names.OUTPUTS]


def serialized_examples(inp: input_pb2.Input, budget: ElementBudget) -> np.ndarray:
    """InputToSerializedExampleTensor: one string per example; with a context, the context's
    bytes then the example's (parsed as one message, the example's features win). The count is
    taken from the budget before any example is serialized."""
    kind = inp.WhichOneof("kind")
    if kind == "example_list":
        examples, prefix = inp.example_list.examples, b""
    elif kind == "example_list_with_context":
        examples = inp.example_list_with_context.examples
        prefix = inp.example_list_with_context.context.SerializeToString()
    else:
        examples, prefix = (), b""
    if not examples:
        raise invalid("Input is empty.")
    budget.take_examples(len(examples))
    out = np.empty(len(examples), dtype=object)
    out[:] = [prefix + e.SerializeToString() for e in examples]
    return out


def _shape(array: np.ndarray) -> str:
    return "[" + ",".join(str(d) for d in array.shape) + "]"


def _dtype(array: np.ndarray) -> str:
    if array.dtype == object or array.dtype.kind in "SU":
        return "DT_STRING"
    return types_pb2.DataType.Name(numpy_dtype_enum(array.dtype))


def _classification_tensor(array, what: str, want: str, rows: int) -> None:
    if array.ndim != 2:
        raise invalid(f"Expected Tensor shape: [batch_size num_classes] but got {_shape(array)}")
    if _dtype(array) != want:
        raise invalid(f"Expected {what} Tensor of {want}. Got: {_dtype(array)}")
    if array.shape[0] != rows:
        raise invalid(f"Expected {what} output batch size of {rows}. Got: {array.shape[0]}")


def classifications(rows: int, outputs: dict[str, np.ndarray], result) -> None:
    """PostProcessClassificationResult: fills a ClassificationResult."""
    classes, scores = outputs.get(names.CLASSES), outputs.get(names.SCORES)
    if classes is not None:
        _classification_tensor(classes, "classes", "DT_STRING", rows)
    if scores is not None:
        _classification_tensor(scores, "scores", "DT_FLOAT", rows)
    if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
        raise invalid(f"Tensors class and score should match in dim_size(1). Got {classes.shape[1]} vs. {scores.shape[1]}")
    width = (classes if classes is not None else scores).shape[1]
    for i in range(rows):
        item = result.classifications.add()
        for j in range(width):
            cls = item.classes.add()
            if classes is not None:
                label = classes[i, j]
                cls.label = label.decode("utf-8", "replace") if isinstance(label, bytes) else str(label)
            if scores is not None:
                cls.score = float(scores[i, j])


def regressions(rows: int, outputs: dict[str, np.ndarray], result) -> None:
    """PostProcessRegressionResult: fills a RegressionResult."""
    values = outputs[names.OUTPUTS]
    if not (values.ndim == 1 or (values.ndim == 2 and values.shape[1] == 1)):
        raise invalid(f"Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got {_shape(values)}")
    if values.shape[0] != rows:
        raise invalid(f"Input batch size did not match output batch size: {rows} vs. {values.shape[0]}")
    if _dtype(values) != "DT_FLOAT":
        raise invalid(f"Expected output Tensor of DT_FLOAT.  Got: {_dtype(values)}")
    for v in values.reshape(-1):
        result.regressions.add(value=float(v))


# -- MultiInference (multi_inference.cc) -----------------------------------------------------------
def multi_inference_tasks(signature_defs, tasks, method_check: bool) -> list[tuple[str, str]]:
    """TensorFlowMultiInferenceRunner::Infer's checks: [(signature key, method)] per task."""
    model_name, seen, out = "", set(), []
    for task in tasks:
        if not task.model_spec.name:
            raise invalid("Found ModelSpec with an empty model name.")
        if not model_name:
            model_name = task.model_spec.name
        elif model_name != task.model_spec.name:
            raise invalid("All ModelSpecs in a MultiInferenceRequest must access the same model name.")
        key = signature_key(task.model_spec.signature_name)
        if key in seen:
            raise invalid(f"Duplicate evaluation of signature: {key}")
        seen.add(key)
        signature = signature_defs.get(key)
        if signature is None:
            raise invalid(f"Requested signature not found in model graph: {key}")
        if task.method_name == names.CLASSIFY_METHOD:
            classification_outputs(signature, method_check)
        elif task.method_name == names.REGRESS_METHOD:
            regression_output(signature, method_check)
        else:
            raise ServingError(grpc.StatusCode.UNIMPLEMENTED, f"Unsupported signature method_name: {task.method_name}")
        out.append((key, task.method_name))
    return out


# -- GetModelMetadata (get_model_metadata_impl.cc) -------------------------------------------------
SIGNATURE_DEF_FIELD = "signature_def"


def check_metadata_request(request) -> None:
    if not request.HasField("model_spec"):
        raise invalid("Missing ModelSpec")
    if not request.metadata_field:
        raise invalid("GetModelMetadataRequest must specify at least one metadata_field")
    for metadata_field in request.metadata_field:
        if metadata_field != SIGNATURE_DEF_FIELD:
            raise invalid(f"Metadata field {metadata_field} is not supported")


def require_model_spec(request) -> None:
    """Predict, Classify, Regress and GetModelStatus refuse a request without a ModelSpec."""
    if not request.HasField("model_spec"):
        raise invalid("Missing ModelSpec")
