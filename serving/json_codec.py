"""TF Serving's REST JSON codec (util/json_tensor.cc, r2.19), on NumPy arrays: request bodies to
named input arrays or tf.Examples, answers to JSON, with its rules and message texts.

- Predict: `instances` (row format: one item per batch row; objects keyed by input name when the
  signature has several) or `inputs` (columnar: the tensor, or an object of them). The answer is
  `predictions` (row) or `outputs` (columnar); one output is written without its name.
- Classify/Regress: `examples` (and an optional `context`), each an object of features; a JSON
  string is a bytes feature, a number with a fraction or exponent a float feature, a whole
  number or a boolean an int64 feature (the model's feature types are not consulted: a whole
  number sent for a float feature fails in the model, as there). Answers: `{"results": ...}`.
- `{"b64": "..."}` is binary data in and out (outputs whose name ends in `_bytes`).
- NaN, Infinity and -Infinity are read and written as numbers.
- Bodies are read as RapidJSON reads them with TF Serving's flags (parse_body); errors are
  `JSON Parse error: <reason> at offset: <n>` with Python's reason texts.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
import re

import grpc
import numpy as np
from tensorflow.core.example import example_pb2
from tensorflow.core.framework import types_pb2

from serving.errors import ServingError, invalid
from serving.request_limits import ElementBudget, over_the_element_limit

_B64 = "b64"
_DEBUG_BYTES = 256  # json_tensor.cc's kMaxJsonDebugStringBytes
_INTS = {types_pb2.DT_INT32: np.int32, types_pb2.DT_INT16: np.int16, types_pb2.DT_INT8: np.int8,
         types_pb2.DT_UINT8: np.uint8, types_pb2.DT_INT64: np.int64, types_pb2.DT_UINT32: np.uint32,
         types_pb2.DT_UINT64: np.uint64}
_INT_RANGE = {types_pb2.DT_INT64: (-2**63, 2**63 - 1), types_pb2.DT_UINT32: (0, 2**32 - 1),
              types_pb2.DT_UINT64: (0, 2**64 - 1)}
_FLOATS = {types_pb2.DT_FLOAT: np.float32, types_pb2.DT_DOUBLE: np.float64}


# -- helpers ---------------------------------------------------------------------------------------
def debug(value) -> str:
    """JsonValueToDebugString: the value as JSON, cut at 256 bytes."""
    return json.dumps(value, separators=(",", ":"))[:_DEBUG_BYTES]


def _type_name(value) -> str:
    if value is None:
        return "Null"
    if value is True:
        return "True"
    if value is False:
        return "False"
    if isinstance(value, dict):
        return "Object"
    if isinstance(value, list):
        return "Array"
    return "String" if isinstance(value, str) else "Number"


def _dtype_string(dtype: int) -> str:
    """DataTypeString: DT_FLOAT -> float."""
    return types_pb2.DataType.Name(dtype)[3:].lower()


def _is_b64(value) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get(_B64), str)


def _b64decode(value) -> bytes:
    if not _is_b64(value):
        raise invalid(f"JSON Value: {debug(value)} not formatted correctly for base64 data")
    try:
        return base64.b64decode(value[_B64], validate=True)
    except (binascii.Error, ValueError):
        raise invalid("Unable to base64 decode") from None


class _NumberTooBig(ValueError):
    pass


def _json_int(text: str):
    """An integer literal as RapidJSON reads it: an int when it fits int64 or uint64, else the
    nearest double; one past the double range is an error. (Python alone would refuse over 4300
    digits with a ValueError, and make any size an int that no tensor type holds.)"""
    if len(text) <= 20:
        value = int(text)
        if -2**63 <= value < 2**64:
            return value
    as_double = float(text)
    if math.isinf(as_double):
        raise _NumberTooBig(text)
    return as_double


_DECODER = json.JSONDecoder(parse_int=_json_int)  # NaN, Infinity and -Infinity are read, as kParseNanAndInfFlag does
_JSON_SPACE = " \t\n\r"
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
MAX_DEPTH = 255  # loopline's limit: a tensor has at most 254 dimensions (TensorShape), plus the request's object


def _deeper_than(doc, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels (iterative: any depth is safe)."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        for item in value.values() if isinstance(value, dict) else value:
            if isinstance(item, (list, dict)):
                stack.append((item, depth + 1))
    return False


def parse_body(body: bytes, max_values: int) -> dict:
    """ParseJson: a non-empty JSON object, read as TF Serving's RapidJSON flags read it (a UTF-8 BOM
    skipped, NaN and Infinity taken, whatever follows the document ignored). Beyond its rules,
    loopline's own, all 400 and never 500: invalid UTF-8, a lone surrogate escape, and nesting over
    MAX_DEPTH levels; and 413 for a body with more than `max_values` commas (no fewer values than
    commas, less one), counted before the body is parsed into Python objects."""
    if not body:
        raise invalid("JSON Parse error: The document is empty")
    if body.count(b",") >= max_values:
        raise over_the_element_limit("the JSON body holds", max_values)
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise invalid(f"JSON Parse error: Invalid encoding in string. at offset: {exc.start}") from None
    start = len(text) - len(text.lstrip(_JSON_SPACE))
    if start == len(text):
        raise invalid(f"JSON Parse error: The document is empty. at offset: {start}")
    try:
        doc, _ = _DECODER.raw_decode(text, start)  # kParseStopWhenDoneFlag: the rest is not read
    except json.JSONDecodeError as exc:
        raise invalid(f"JSON Parse error: {exc.msg} at offset: {exc.pos}") from None
    except _NumberTooBig:
        raise invalid("JSON Parse error: Number too big to be stored in double.") from None
    except RecursionError:
        raise invalid(f"JSON Parse error: the document nests deeper than {MAX_DEPTH} levels") from None
    if isinstance(doc, (list, dict)) and (text.count("[") + text.count("{") > MAX_DEPTH) and _deeper_than(doc, MAX_DEPTH):
        raise invalid(f"JSON Parse error: the document nests deeper than {MAX_DEPTH} levels")
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(doc):
        raise invalid("JSON Parse error: The surrogate pair in string is invalid.")
    if not isinstance(doc, dict):
        raise invalid(f"JSON Value: {debug(doc)} Is not object")
    return doc


def _has_lone_surrogate(doc) -> bool:
    """A `\\uD800`-style escape without its pair decodes to a string UTF-8 cannot hold."""
    try:
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def signature_name(doc: dict) -> str:
    """FillSignature: the optional `signature_name`."""
    name = doc.get("signature_name", "")
    if not isinstance(name, str):
        raise invalid(f"JSON Value: {debug(doc)} not formatted correctly. 'signature_name' key must be a string value.")
    return name


def _format_error(doc, *parts: str):
    return invalid(f"JSON Value: {debug(doc)} " + "".join(parts))


# -- tensors in ------------------------------------------------------------------------------------
def _shape(value) -> list[int]:
    """GetDenseTensorShape: the sizes along the first element of each level."""
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def _leaf(value, dtype: int):
    """AddValueToTensor (and the b64 object for strings)."""
    def type_error():
        return invalid(f"JSON Value: {debug(value)} Type: {_type_name(value)} is not of expected type: {_dtype_string(dtype)}")

    if isinstance(value, dict):
        if dtype != types_pb2.DT_STRING:
            raise type_error()
        return _b64decode(value)
    if dtype == types_pb2.DT_STRING:
        if not isinstance(value, str):
            raise type_error()
        return value.encode()
    if dtype == types_pb2.DT_BOOL:
        if not isinstance(value, bool):
            raise type_error()
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise type_error()
    if dtype in _FLOATS:
        return value
    if dtype in _INTS:
        low, high = _INT_RANGE.get(dtype, (-2**31, 2**31 - 1))
        if not isinstance(value, int) or not low <= value <= high:
            raise type_error()
        return value
    raise ServingError(grpc.StatusCode.UNIMPLEMENTED, f"Conversion of JSON Value: {debug(value)} to type: {_dtype_string(dtype)}")


def _fill(value, level: int, shape: list[int], dtype: int, out: list) -> None:
    """FillTensorProto: values in row-major order, checking every list against the shape."""
    rank = len(shape)
    if not isinstance(value, list):
        if level != rank:
            raise invalid(f"JSON Value: {debug(value)} found at incorrect level: {level + 1} in the JSON DOM. "
                          f"Expected at level: {rank}")
        out.append(_leaf(value, dtype))
        return
    if level >= rank:
        raise invalid(f"Encountered list at unexpected level: {level} expected < {rank}")
    if len(value) != shape[level]:
        raise invalid(f"Encountered list at unexpected size: {len(value)} at level: {level} expected size: {shape[level]}")
    for item in value:
        _fill(item, level + 1, shape, dtype, out)


def _array(values: list, shape: list[int], dtype: int) -> np.ndarray:
    if dtype == types_pb2.DT_STRING:
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array.reshape(shape)
    numpy_type = _FLOATS.get(dtype) or _INTS.get(dtype) or np.bool_
    return np.array(values, dtype=numpy_type).reshape(shape)


def tensor(value, dtype: int, name: str, budget: ElementBudget) -> np.ndarray:
    """One JSON value (scalar or nested list) as an array of `dtype`, its shape within the limits."""
    shape = _shape(value)
    budget.take(name, shape)
    values: list = []
    _fill(value, 0, shape, dtype, values)
    return _array(values, shape, dtype)


def _instances(rows: list, input_dtypes: dict[str, int], budget: ElementBudget) -> dict[str, np.ndarray]:
    """FillTensorMapFromInstancesList: one item per row, stacked on a new first dimension."""
    first = rows[0]
    if not isinstance(first, dict) and len(input_dtypes) > 1:
        raise invalid("instances is a plain list, but expecting list of objects as multiple input tensors required as "
                      "per tensorinfo_map")
    as_objects = isinstance(first, dict) and not _is_b64(first)
    names = sorted(input_dtypes)
    values: dict[str, list] = {}
    shapes: dict[str, list[int]] = {}

    def add(item, name: str) -> None:  # AddInstanceItem
        if name not in input_dtypes:
            raise invalid(f"JSON object: does not have named input: {name}")
        shape = _shape(item)
        budget.check_rank(name, len(shape) + 1)  # the rows' dimension comes first
        out: list = []
        _fill(item, 0, shape, input_dtypes[name], out)
        if name not in shapes:
            shapes[name], values[name] = shape, []
        elif math.prod(shapes[name]) != len(out):
            raise invalid(f"Expecting tensor size: {math.prod(shapes[name])} but got: {len(out)}")
        elif shapes[name] != shape:
            raise invalid(f"Expecting shape [{','.join(map(str, shapes[name]))}] but got: [{','.join(map(str, shape))}]")
        values[name].extend(out)

    for index, row in enumerate(rows):
        if as_objects:
            if not (isinstance(row, dict) and not _is_b64(row)):
                raise invalid(f"Expecting object but got list at item {index} of input list")
            for name, item in row.items():
                try:
                    add(item, name)
                except Exception as exc:
                    raise invalid(f"Failed to process element: {index} key: {name} of 'instances' list. "
                                  f"Error: INVALID_ARGUMENT: {getattr(exc, 'message', exc)}") from None
            if set(row) != set(names):
                raise invalid(f"Failed to process element: {index} of 'instances' list. JSON object: {debug(row)} "
                              f"keys must be equal to: {','.join(names)}")
        else:
            if isinstance(row, dict) and not _is_b64(row):
                raise invalid(f"Expecting value/list but got object at item {index} of input list")
            try:
                add(row, names[0])
            except Exception as exc:
                raise invalid(f"Failed to process element: {index} of 'instances' list. "
                              f"Error: INVALID_ARGUMENT: {getattr(exc, 'message', exc)}") from None
    for name in values:
        budget.take(name, [len(rows), *shapes[name]])
    return {name: _array(values[name], [len(rows), *shapes[name]], input_dtypes[name]) for name in values}


def _inputs(value, input_dtypes: dict[str, int], budget: ElementBudget) -> dict[str, np.ndarray]:
    """FillTensorMapFromInputsMap: the tensor itself (one input), or an object of them."""
    if not isinstance(value, dict) or _is_b64(value):
        if len(input_dtypes) > 1:
            raise invalid("inputs is a plain value/list, but expecting an object as multiple input tensors required as "
                          "per tensorinfo_map")
        name = next(iter(input_dtypes))
        return {name: tensor(value, input_dtypes[name], name, budget)}
    out = {}
    for name in sorted(input_dtypes):
        if name not in value:
            raise invalid(f"Missing named input: {name} in 'inputs' object.")
        out[name] = tensor(value[name], input_dtypes[name], name, budget)
    return out


def predict_inputs(doc: dict, input_dtypes: dict[str, int], signature: str,
                   budget: ElementBudget) -> tuple[dict[str, np.ndarray], bool]:
    """FillPredictRequestFromJson: (named input arrays, row format?). `input_dtypes`: the
    signature's inputs and their DataType enums; `budget`: the request's limits, checked on each
    tensor's shape before its values are converted."""
    if not input_dtypes:
        raise invalid(f"Failed to get input map for signature: {signature or 'DEFAULT'}")
    has_instances, has_inputs = "instances" in doc, "inputs" in doc
    if has_instances and has_inputs:
        raise _format_error(doc, "Not formatted correctly expecting only one of 'inputs' or 'instances' keys to exist ")
    if has_instances:
        rows = doc["instances"]
        if not isinstance(rows, list):
            raise _format_error(doc, "Expecting 'instances' to be an list/array")
        if not rows:
            raise _format_error(doc, "No values in 'instances' array")
        return _instances(rows, input_dtypes, budget), True
    if has_inputs:
        return _inputs(doc["inputs"], input_dtypes, budget), False
    raise invalid("Missing 'inputs' or 'instances' key")


# -- examples in -----------------------------------------------------------------------------------
_KIND_NAMES = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64", None: "UNKNOWN"}


def _add_feature_value(value, name: str, feature: example_pb2.Feature) -> None:
    """AddValueToFeature."""
    if value is None or isinstance(value, list) or (isinstance(value, dict) and not _is_b64(value)):
        raise invalid(f"Feature: {name} has element with unexpected JSON type: {_type_name(value)}")
    if isinstance(value, bool):
        kind, item = "int64_list", int(value)
    elif isinstance(value, dict):
        kind, item = "bytes_list", _b64decode(value)
    elif isinstance(value, str):
        kind, item = "bytes_list", value.encode()
    elif isinstance(value, float):
        kind, item = "float_list", value
    else:
        if not -2**63 <= value < 2**63:
            raise invalid(f"Feature: {name} has uint64_t element. Only int64_t is supported.")
        kind, item = "int64_list", value
    current = feature.WhichOneof("kind")
    if current not in (None, kind):
        raise invalid(f"Unexpected element type in feature: {name} expecting type: {_KIND_NAMES[current]}")
    getattr(feature, kind).value.append(item)


def example(value) -> example_pb2.Example:
    """MakeExampleFromJsonObject."""
    if not isinstance(value, dict):
        raise invalid(f"Example must be JSON object but got JSON {_type_name(value)}")
    out = example_pb2.Example()
    for name, content in value.items():
        feature = out.features.feature[name]
        for item in (content if isinstance(content, list) else [content]):
            _add_feature_value(item, name, feature)
    return out


def fill_examples(doc: dict, inp) -> None:
    """FillClassifyRegressRequestFromJson: `context` (optional) and `examples` into an Input."""
    target = inp.example_list
    if "context" in doc:
        inp.example_list_with_context.context.CopyFrom(example(doc["context"]))
        target = inp.example_list_with_context
    examples = doc.get("examples")
    if "examples" not in doc:
        raise _format_error(doc, "When method is classify, key 'examples' is expected and was not found")
    if not isinstance(examples, list):
        raise _format_error(doc, "Expecting 'examples' value to be an list/array")
    if not examples:
        raise _format_error(doc, "'examples' value is an empty array")
    for item in examples:
        target.examples.append(example(item))


# -- answers out -----------------------------------------------------------------------------------
def _number(value: float):
    """WriteDecimal: float32 values by their shortest decimal form (0.2, not 0.2000000029802)."""
    return float(str(value)) if math.isfinite(value) else float(value)


def _values(array: np.ndarray, as_bytes: bool):
    """AddTensorValues: nested lists; strings as text (b64 objects for `_bytes` outputs)."""
    if array.dtype == object or array.dtype.kind in "SU":
        flat = [{_B64: base64.b64encode(v if isinstance(v, bytes) else str(v).encode()).decode()} if as_bytes else
                (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)) for v in array.reshape(-1)]
    elif array.dtype == np.float32:
        flat = [_number(v) for v in array.reshape(-1)]
    else:
        return array.tolist()
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(array.shape).tolist()


def predict_answer(outputs: dict[str, np.ndarray], row_format: bool) -> dict:
    """MakeJsonFromTensors: `predictions` (row format) or `outputs` (columnar)."""
    if not outputs:
        raise invalid("Cannot convert empty tensor map to JSON")
    names = sorted(outputs)
    if not row_format:
        if len(names) == 1:
            return {"outputs": _values(outputs[names[0]], names[0].endswith("_bytes"))}
        return {"outputs": {n: _values(outputs[n], n.endswith("_bytes")) for n in names}}
    batch = None
    for name in names:
        if outputs[name].ndim == 0:
            raise invalid(f"Tensor name: {name} has no shape information ")
        if batch is not None and outputs[name].shape[0] != batch:
            raise invalid(f"Tensor name: {name} has inconsistent batch size: {outputs[name].shape[0]} expecting: {batch}")
        batch = outputs[name].shape[0]
    columns = {n: _values(outputs[n], n.endswith("_bytes")) for n in names}
    if len(names) == 1:
        return {"predictions": columns[names[0]]}
    return {"predictions": [{n: columns[n][i] for n in names} for i in range(batch)]}


def classify_answer(result) -> dict:
    """MakeJsonFromClassificationResult: [[label, score], ...] per example, under `results`."""
    return {"results": [[[c.label, _number(np.float32(c.score))] for c in item.classes] for item in result.classifications]}


def regress_answer(result) -> dict:
    """MakeJsonFromRegressionResult: one value per example, under `results`."""
    return {"results": [_number(np.float32(r.value)) for r in result.regressions]}


def dumps(payload) -> bytes:
    """JSON text; NaN and infinities as the NaN/Infinity/-Infinity tokens TF Serving writes."""
    return json.dumps(payload, separators=(",", ":")).encode()
