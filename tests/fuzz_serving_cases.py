"""What a client can send `loopline serve`, as hypothesis strategies (the serving fuzzer's cases).

- gRPC: TF Serving's request protos with every DataType (unknown numbers too), ranks 0-300, any
  int64 dimension, unknown rank, every `*_val` field crossed with every dtype, tensor_content of
  the wrong length, odd tf.Examples, model specs, output filters; and raw request bytes (random,
  or a valid request's bytes bit-flipped, cut, spliced or nested past protobuf's depth limit).
- REST: JSON bodies (nesting up to 300 levels, b64 objects at any level, row and columnar forms,
  out-of-range numbers, NaN, bad encodings, trailing garbage, bodies around the size limit) and
  URL paths.
- HTTP: whole exchanges as bytes (request lines, Content-Length, chunked bodies, header junk,
  pipelining, cuts), and request heads that never end.

Most cases start from what the served model (tests/serving_helpers.py's) accepts and change part
of it, so they get past the name checks to the parsing behind them.
"""
from __future__ import annotations

import base64
import gzip
import json
import math
import urllib.parse

from hypothesis import strategies as st
from tensorflow.core.example import example_pb2
from tensorflow.core.framework import resource_handle_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    input_pb2,
    model_pb2,
    predict_pb2,
    regression_pb2,
)

from tests.serving_helpers import example

MODEL = "penguins"
MAX_BODY_BYTES = 16 * 1024 * 1024  # serving.max_request_bytes' default, which the fuzzed server keeps
STRING, FLOAT = types_pb2.DT_STRING, types_pb2.DT_FLOAT
RAW_INPUTS = {"bill_length_mm": FLOAT, "flipper_length_mm": FLOAT, "island": STRING}
EXAMPLE_SIGNATURES = ("", "serving_default", "predict", "classify_species", "regress_body_mass_g")
SIGNATURE_INPUTS = {**{name: {"inputs": STRING} for name in EXAMPLE_SIGNATURES}, "predict_raw": RAW_INPUTS}
OUTPUTS = ("classes", "scores", "outputs", "species_classes", "species_scores", "body_mass_g_outputs")
TASK_METHODS = ("tensorflow/serving/classify", "tensorflow/serving/regress", "tensorflow/serving/predict")
VALID_EXAMPLE = example()

INT32 = st.integers(-2**31, 2**31 - 1)
INT64 = st.integers(-2**63, 2**63 - 1)
EDGE_DIMS = (-1, -2, -2**63, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1)
TEXT = st.text(max_size=24)


def one_in(n: int):
    """True about once in `n` draws; shrinks to False. (Not `integers(0, n - 1) == 0`: hypothesis
    draws a range's ends far more often than 1/n.)"""
    return st.integers(0, n - 1).map(lambda i: i == n // 2)


def mostly(usual, other, one_in_n: int = 5):
    """`usual` except about one time in `one_in_n` (shrinks towards `usual`)."""
    return one_in(one_in_n).flatmap(lambda rare: other if rare else usual)


# -- tensors ---------------------------------------------------------------------------------------
DTYPES = st.one_of(st.sampled_from(sorted(types_pb2.DataType.values())), INT32)  # every enum value, then any
DIMS = st.one_of(st.integers(0, 3), st.sampled_from(EDGE_DIMS), INT64)
ITEM_BYTES = {types_pb2.DT_FLOAT: 4, types_pb2.DT_DOUBLE: 8, types_pb2.DT_INT32: 4, types_pb2.DT_INT16: 2,
              types_pb2.DT_INT8: 1, types_pb2.DT_UINT8: 1, types_pb2.DT_INT64: 8, types_pb2.DT_BOOL: 1,
              types_pb2.DT_HALF: 2, types_pb2.DT_BFLOAT16: 2, types_pb2.DT_COMPLEX64: 8,
              types_pb2.DT_COMPLEX128: 16, types_pb2.DT_UINT32: 4, types_pb2.DT_UINT64: 8}


@st.composite
def shapes(draw) -> tensor_shape_pb2.TensorShapeProto:
    """Small shapes of any dims; one size repeated up to rank 300; deep shapes of ones with a few
    odd dims; unknown rank (with or without dims)."""
    shape = tensor_shape_pb2.TensorShapeProto()
    form = draw(st.sampled_from(["small", "repeated", "deep", "unknown"]))
    if form == "small":
        sizes = draw(st.lists(DIMS, max_size=6))
    elif form == "repeated":
        sizes = [draw(st.sampled_from([1, 0, 2]))] * draw(st.integers(0, 300))
    elif form == "deep":
        sizes = [1] * draw(st.integers(5, 300))
        for at, size in draw(st.lists(st.tuples(st.integers(0, len(sizes) - 1), DIMS), max_size=3)):
            sizes[at] = size
    else:
        shape.unknown_rank = True
        sizes = draw(st.lists(DIMS, max_size=3))
    for size in sizes:
        shape.dim.add(size=size)
    if sizes and draw(one_in(10)):
        shape.dim[0].name = draw(TEXT)
    return shape


def _element_count(shape: tensor_shape_pb2.TensorShapeProto) -> int | None:
    sizes = [d.size for d in shape.dim]
    if shape.unknown_rank or any(s < 0 for s in sizes):
        return None
    count = math.prod(sizes)
    return count if count <= 64 else None


@st.composite
def resource_handles(draw) -> resource_handle_pb2.ResourceHandleProto:
    return resource_handle_pb2.ResourceHandleProto(device=draw(TEXT), container=draw(TEXT), name=draw(TEXT),
                                                   hash_code=draw(st.integers(0, 2**64 - 1)),
                                                   maybe_type_name=draw(TEXT))


@st.composite
def variants(draw) -> tensor_pb2.VariantTensorDataProto:
    variant = tensor_pb2.VariantTensorDataProto(type_name=draw(TEXT), metadata=draw(st.binary(max_size=16)))
    if draw(st.booleans()):
        variant.tensors.add(dtype=draw(DTYPES), string_val=[b"x"])
    return variant


@st.composite
def huge_strings(draw) -> bytes:
    """A string just over the request limits (the gRPC message, serving.limits.max_string_bytes)."""
    return b"x" * draw(st.sampled_from([MAX_BODY_BYTES + 1, 20 * 1024 * 1024]))


STRING_VALUES = st.one_of(st.binary(max_size=32), st.just(VALID_EXAMPLE.SerializeToString()),
                          st.deferred(lambda: tf_examples().map(lambda e: e.SerializeToString())))
VALUES = {  # every repeated value field of TensorProto, with values its wire type can hold
    "float_val": st.floats(width=32), "double_val": st.floats(), "int_val": INT32, "half_val": INT32,
    "int64_val": INT64, "bool_val": st.booleans(), "string_val": STRING_VALUES, "scomplex_val": st.floats(width=32),
    "dcomplex_val": st.floats(), "uint32_val": st.integers(0, 2**32 - 1), "uint64_val": st.integers(0, 2**64 - 1),
    "resource_handle_val": resource_handles(), "variant_val": variants(),
}
MESSAGE_FIELDS = ("resource_handle_val", "variant_val")
DTYPE_FIELDS = {types_pb2.DT_FLOAT: "float_val", types_pb2.DT_DOUBLE: "double_val", types_pb2.DT_INT32: "int_val",
                types_pb2.DT_INT64: "int64_val", types_pb2.DT_STRING: "string_val", types_pb2.DT_BOOL: "bool_val",
                types_pb2.DT_HALF: "half_val", types_pb2.DT_COMPLEX64: "scomplex_val",
                types_pb2.DT_COMPLEX128: "dcomplex_val", types_pb2.DT_RESOURCE: "resource_handle_val",
                types_pb2.DT_VARIANT: "variant_val", types_pb2.DT_UINT32: "uint32_val", types_pb2.DT_UINT64: "uint64_val"}


@st.composite
def tensors(draw, usual_dtype: int | None = None) -> tensor_pb2.TensorProto:
    """A TensorProto of any dtype (mostly `usual_dtype`), shape and content: value fields (mostly
    the dtype's own; as many values as the shape needs, one, or any count), tensor_content of the
    right length, one off, empty or random, float8_val bytes."""
    dtype = draw(DTYPES if usual_dtype is None else mostly(st.just(usual_dtype), DTYPES, one_in_n=3))
    proto = tensor_pb2.TensorProto(dtype=dtype)
    proto.tensor_shape.CopyFrom(draw(shapes()))
    count = _element_count(proto.tensor_shape)
    any_fields = st.lists(st.sampled_from(sorted(VALUES)), max_size=2, unique=True)
    own = DTYPE_FIELDS.get(dtype)
    for field in draw(any_fields if own is None else mostly(st.just([own]), any_fields)):
        sizes = st.integers(0, 8) if count is None else mostly(st.sampled_from([count, 1]),
                                                                st.sampled_from([0, count + 1, max(count - 1, 0)]), 3)
        values = draw(st.lists(VALUES[field], min_size=(n := draw(sizes)), max_size=n))
        if field in MESSAGE_FIELDS:
            for value in values:
                getattr(proto, field).add().CopyFrom(value)
        else:
            getattr(proto, field).extend(values)
    if draw(one_in(3)):
        exact = None if count is None else count * ITEM_BYTES.get(dtype, 1)
        length = draw(st.integers(0, 64) if exact is None else st.sampled_from([exact, exact + 1, max(exact - 1, 0), 0]))
        proto.tensor_content = draw(st.binary(min_size=length, max_size=length))
    if draw(one_in(10)):
        proto.float8_val = draw(st.binary(max_size=16))
    if draw(one_in(50)):
        proto.string_val.append(draw(huge_strings()))
    if draw(one_in(20)):
        proto.version_number = draw(INT32)
    return proto


def valid_tensor(name: str) -> tensor_pb2.TensorProto:
    """What the served model takes for input `name`: one serialized example, or one [1, 1] value."""
    if name == "inputs":
        proto = tensor_pb2.TensorProto(dtype=STRING, string_val=[VALID_EXAMPLE.SerializeToString()])
        proto.tensor_shape.dim.add(size=1)
        return proto
    dtype = RAW_INPUTS.get(name, FLOAT)
    proto = tensor_pb2.TensorProto(dtype=dtype)
    proto.tensor_shape.dim.add(size=1)
    proto.tensor_shape.dim.add(size=1)
    if dtype == STRING:
        proto.string_val.append(b"Dream")
    else:
        proto.float_val.append(40.0)
    return proto


# -- model specs and tf.Examples -------------------------------------------------------------------
SIGNATURES = mostly(st.sampled_from(sorted(SIGNATURE_INPUTS)),
                    st.one_of(st.sampled_from(["__saved_model_init_op", "nope", "PREDICT_RAW"]), TEXT))


@st.composite
def model_specs(draw, signatures=SIGNATURES) -> model_pb2.ModelSpec:
    """Mostly the served model; other names, versions (any int64) and labels."""
    spec = model_pb2.ModelSpec(signature_name=draw(signatures))
    spec.name = draw(mostly(st.just(MODEL), st.one_of(st.sampled_from(["", "nope", "Penguins", "penguins/1"]), TEXT)))
    choice = draw(mostly(st.just("none"), st.sampled_from(["version", "label"]), one_in_n=4))
    if choice == "version":
        spec.version.value = draw(st.one_of(st.sampled_from([1, 0, -1, 2]), INT64))
    elif choice == "label":
        spec.version_label = draw(st.one_of(st.sampled_from(["stable", "canary", ""]), TEXT))
    return spec


FEATURE_NAMES = st.one_of(st.sampled_from(sorted(RAW_INPUTS)), TEXT)
FEATURE_VALUES = {"bytes_list": st.binary(max_size=16), "float_list": st.floats(width=32), "int64_list": INT64}


@st.composite
def feature_lists(draw, kind: str) -> list:
    """A few values, none, or one value repeated to a huge list."""
    base = FEATURE_VALUES[kind]
    if draw(one_in(10)):
        return [draw(base)] * draw(st.sampled_from([1000, 100_000]))
    return draw(st.lists(base, max_size=4))


@st.composite
def tf_examples(draw) -> example_pb2.Example:
    """The served model's example (or an empty one) with features replaced, retyped, emptied,
    grown huge, or added under other names."""
    out = example_pb2.Example()
    if draw(mostly(st.just(True), st.just(False), 3)):
        out.CopyFrom(VALID_EXAMPLE)
    for name in draw(mostly(st.just([]), st.lists(FEATURE_NAMES, min_size=1, max_size=3), 2)):
        feature = out.features.feature[name]
        feature.Clear()
        kind = draw(st.sampled_from([*FEATURE_VALUES, None]))
        if kind is not None:
            getattr(feature, kind).value.extend(draw(feature_lists(kind)))
    return out


@st.composite
def example_inputs(draw) -> input_pb2.Input:
    """An example list, one with a context, or an empty Input; sometimes a thousand small examples."""
    inp = input_pb2.Input()
    form = draw(mostly(st.sampled_from(["list", "context"]), st.just("empty")))
    examples = draw(mostly(st.lists(tf_examples(), min_size=1, max_size=4), st.just([])))
    if sum(e.ByteSize() for e in examples) < 10_000:  # a thousand small examples, not a gigabyte
        examples *= draw(mostly(st.just(1), st.just(1000), one_in_n=10))
    if form == "list":
        inp.example_list.examples.extend(examples)
    elif form == "context":
        inp.example_list_with_context.context.CopyFrom(draw(tf_examples()))
        inp.example_list_with_context.examples.extend(examples)
    return inp


# -- gRPC calls: (method, request, gzip-compressed?) ----------------------------------------------
COMPRESS = mostly(st.just(False), st.just(True), one_in_n=8)


@st.composite
def predict_calls(draw) -> tuple[str, predict_pb2.PredictRequest, bool]:
    """One of the signature's inputs fuzzed, the others mostly valid (sometimes left out or fuzzed
    too); sometimes extra inputs and output filters."""
    request = predict_pb2.PredictRequest(model_spec=draw(model_specs()))
    wanted = SIGNATURE_INPUTS.get(request.model_spec.signature_name, {"inputs": STRING})
    fuzzed = draw(st.sampled_from(sorted(wanted)))
    for name, dtype in wanted.items():
        form = "fuzzed" if name == fuzzed else draw(mostly(st.just("valid"), st.sampled_from(["fuzzed", "missing"])))
        if form != "missing":
            request.inputs[name].CopyFrom(draw(tensors(dtype)) if form == "fuzzed" else valid_tensor(name))
    extra = st.dictionaries(FEATURE_NAMES | st.just("inputs"), tensors(), min_size=1, max_size=2)
    for name, tensor in draw(mostly(st.just({}), extra)).items():
        request.inputs[name].CopyFrom(tensor)
    output_filter = st.lists(st.one_of(st.sampled_from(OUTPUTS), TEXT), min_size=1, max_size=3)
    request.output_filter.extend(draw(mostly(st.just([]), output_filter)))
    return "Predict", request, draw(COMPRESS)


EXAMPLE_METHODS = {"Classify": ("tensorflow/serving/classify", ["", "serving_default", "classify_species"]),
                   "Regress": ("tensorflow/serving/regress", ["regress_body_mass_g"])}


@st.composite
def example_calls(draw) -> tuple[str, object, bool]:
    """Classify, Regress and MultiInference (tasks of either) over odd inputs, specs and tasks;
    mostly with a signature of the method's kind."""
    method = draw(st.sampled_from(["Classify", "Regress", "MultiInference"]))
    if method != "MultiInference":
        signatures = mostly(st.sampled_from(EXAMPLE_METHODS[method][1]), SIGNATURES)
        kind = classification_pb2.ClassificationRequest if method == "Classify" else regression_pb2.RegressionRequest
        return method, kind(model_spec=draw(model_specs(signatures)), input=draw(example_inputs())), draw(COMPRESS)
    request = inference_pb2.MultiInferenceRequest(input=draw(example_inputs()))
    for _ in range(draw(mostly(st.integers(1, 2), st.sampled_from([0, 3])))):
        task_method, signatures = EXAMPLE_METHODS[draw(st.sampled_from(sorted(EXAMPLE_METHODS)))]
        request.tasks.add(model_spec=draw(model_specs(mostly(st.sampled_from(signatures), SIGNATURES))),
                          method_name=draw(mostly(st.just(task_method), st.one_of(st.sampled_from(TASK_METHODS), TEXT))))
    return method, request, draw(COMPRESS)


@st.composite
def metadata_calls(draw) -> tuple[str, object, bool]:
    """GetModelMetadata (metadata fields: the one served, none, others, repeated) and GetModelStatus."""
    if draw(st.booleans()):
        fields = draw(st.lists(st.one_of(st.just("signature_def"), TEXT), max_size=3))
        return "GetModelMetadata", get_model_metadata_pb2.GetModelMetadataRequest(
            model_spec=draw(model_specs()), metadata_field=fields), False
    return "GetModelStatus", get_model_status_pb2.GetModelStatusRequest(model_spec=draw(model_specs())), False


GRPC_PATHS = {
    "Predict": "/tensorflow.serving.PredictionService/Predict",
    "Classify": "/tensorflow.serving.PredictionService/Classify",
    "Regress": "/tensorflow.serving.PredictionService/Regress",
    "MultiInference": "/tensorflow.serving.PredictionService/MultiInference",
    "GetModelMetadata": "/tensorflow.serving.PredictionService/GetModelMetadata",
    "GetModelStatus": "/tensorflow.serving.ModelService/GetModelStatus",
}  # HandleReloadConfigRequest is left out: a request that parses would change what is served


def _field_head(number: int, length: int) -> bytes:
    """A length-delimited protobuf field's tag and length."""
    varint = bytearray()
    while True:
        varint.append((length & 0x7F) | (0x80 if length > 0x7F else 0))
        length >>= 7
        if not length:
            return bytes([number << 3 | 2]) + bytes(varint)


def nested_variants(depth: int) -> bytes:
    """A Predict request whose input nests TensorProto in VariantTensorDataProto `depth` times
    (two messages a level: protobuf's limit of 100 parses 49 and refuses 50); built inside out,
    without copies."""
    heads, tensor_length = [], 0
    for _ in range(depth):  # TensorProto.variant_val (15) -> VariantTensorDataProto.tensors (3) -> ...
        inner = _field_head(3, tensor_length)
        outer = _field_head(15, len(inner) + tensor_length)
        heads.append(outer + inner)
        tensor_length += len(outer) + len(inner)
    tensor = b"".join(reversed(heads))
    entry = _field_head(1, 6) + b"inputs" + _field_head(2, len(tensor)) + tensor  # map<string, TensorProto> inputs
    spec = _field_head(1, len(MODEL)) + MODEL.encode()
    return _field_head(1, len(spec)) + spec + _field_head(2, len(entry)) + entry


@st.composite
def raw_calls(draw) -> tuple[str, bytes]:
    """(method path, request bytes): random bytes, a valid request's bytes with bits flipped, cut or
    spliced, or nested past protobuf's depth limit; sometimes to a method that does not exist."""
    method = draw(mostly(st.sampled_from(sorted(GRPC_PATHS.values())),
                         st.sampled_from(["/tensorflow.serving.PredictionService/Nope", "/x/y", "/"])))
    form = draw(st.sampled_from(["flip", "cut", "splice", "random", "deep"]))
    if form == "random":
        return method, draw(st.binary(max_size=256))
    if form == "deep":
        return method, nested_variants(draw(st.sampled_from([10, 49, 50, 1000, 20_000])))
    payload = bytearray(draw(st.one_of(predict_calls(), example_calls(), metadata_calls()))[1].SerializeToString())
    if form == "flip" and payload:
        for bit in draw(st.lists(st.integers(0, len(payload) * 8 - 1), min_size=1, max_size=8)):
            payload[bit // 8] ^= 1 << bit % 8
    elif form == "cut":
        del payload[draw(st.integers(0, len(payload))):]
    else:
        at = draw(st.integers(0, len(payload)))
        payload[at:at] = draw(st.binary(min_size=1, max_size=16))
    return method, bytes(payload)


# -- REST bodies -----------------------------------------------------------------------------------
class Raw(str):
    """A JSON literal written as it is (1e400, 18446744073709551616, -0, a 5000-digit number)."""


NUMBER_LITERALS = ["1e400", "-1e400", "-0", "-0.0", "0.1e-400", "18446744073709551615", "18446744073709551616",
                   "9223372036854775808", "-9223372036854775809", "4294967296", "1" + "0" * 400, "1" + "0" * 5000,
                   "NaN", "Infinity", "-Infinity", "1E+2", "01", "1.", ".5", "+1", "0x10", "-"]
NUMBERS = st.one_of(st.integers(-2**70, 2**70), st.floats(), st.sampled_from(NUMBER_LITERALS).map(Raw))
B64_EXAMPLE = {"b64": base64.b64encode(VALID_EXAMPLE.SerializeToString()).decode()}
B64 = st.one_of(st.just(B64_EXAMPLE), st.just({"b64": "AA=="}),
                st.binary(max_size=12).map(lambda b: {"b64": base64.b64encode(b).decode()}),
                st.sampled_from([{"b64": "!!"}, {"b64": 5}, {"b64": "AA==", "x": 1}]))
LEAVES = st.one_of(NUMBERS, st.text(max_size=12), st.booleans(), st.none(), B64)
JSON = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=4), max_leaves=20)


def to_json(value) -> str:
    """JSON text as a client may write it: NaN/Infinity tokens and Raw literals kept as they are."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{to_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    return json.dumps(value)


@st.composite
def nested(draw, leaf=B64):
    """A leaf (a b64 object by default) nested 1-300 levels deep: in lists only (a tensor of that
    rank), in objects, or in a mix where leaves sit at other levels too."""
    value = draw(leaf)
    form = draw(st.sampled_from(["lists", "objects", "mixed"]))
    for _ in range(draw(st.integers(1, 300))):
        kind = form if form != "mixed" else draw(st.sampled_from(["lists", "objects", "leaf beside"]))
        value = [value] if kind == "lists" else {"a": value} if kind == "objects" else [value, draw(leaf)]
    return value


@st.composite
def input_values(draw, name: str):
    """A value for one input: what the model takes, another type, a nested list, a deep one."""
    usual = st.just(B64_EXAMPLE) if name == "inputs" else st.just(["Dream"]) if name == "island" else st.just([40.0])
    return draw(st.one_of(usual, LEAVES, st.lists(LEAVES, max_size=3), nested(LEAVES), JSON))


@st.composite
def predict_docs(draw) -> dict:
    """{"instances": rows} and/or {"inputs": columns} (or neither) for a signature of the model."""
    doc = {}
    signature = draw(st.sampled_from(["", "predict_raw", "serving_default", "nope"]))
    if signature or draw(st.booleans()):
        doc["signature_name"] = draw(mostly(st.just(signature), LEAVES))
    names = list(SIGNATURE_INPUTS.get(signature, {"inputs": STRING}))
    values = {n: input_values(n) for n in names}
    keyed = mostly(st.fixed_dictionaries(values, optional={"extra": JSON}), st.fixed_dictionaries({}, optional=values))
    form = draw(st.sampled_from(["instances", "inputs", "both", "neither"]))
    if form in ("instances", "both"):
        row = keyed if len(names) > 1 else st.one_of(input_values(names[0]), keyed)
        doc["instances"] = draw(mostly(st.lists(row, min_size=1, max_size=3), JSON))
    if form in ("inputs", "both"):
        doc["inputs"] = draw(st.one_of(keyed, input_values(names[0]), nested()))
    return doc


MUTATIONS = ["none", "bom", "trailing", "bad_utf8", "surrogate", "cut", "whitespace"]


@st.composite
def json_bodies(draw, docs) -> bytes:
    """A document's JSON text, maybe with a BOM, trailing garbage, invalid UTF-8, a lone surrogate
    escape, cut short; or an empty or blank body."""
    text = to_json(draw(docs)).encode()
    mutation = draw(mostly(st.just("none"), st.sampled_from(MUTATIONS)))
    if mutation == "bom":
        return b"\xef\xbb\xbf" + text
    if mutation == "trailing":
        return text + draw(st.sampled_from([b"}", b" garbage", b"\x00", b"{}", b"]]]"]))
    at = draw(st.integers(0, len(text)))
    if mutation == "bad_utf8":
        return text[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"])) + text[at:]
    if mutation == "surrogate":
        return text.replace(b'"', b'"\\ud800', 1) if b'"' in text else text
    if mutation == "cut":
        return text[:at]
    if mutation == "whitespace":
        return draw(st.sampled_from([b"", b" ", b"\n\t", b"\xef\xbb\xbf"]))
    return text


@st.composite
def big_bodies(draw) -> bytes:
    """A plain list of numbers just under or over the body limit (the JSON is cheap to build)."""
    size = draw(st.sampled_from([MAX_BODY_BYTES - 64, MAX_BODY_BYTES + 64]))
    head, tail = b'{"instances": [', b"0]}"
    return head + b"0," * ((size - len(head) - len(tail)) // 2) + tail


@st.composite
def deep_docs(draw) -> dict:
    """A nested value as a default or predict_raw signature's `inputs`, or as `instances`."""
    doc = {"signature_name": draw(st.sampled_from(["", "predict_raw"]))}
    key = draw(st.sampled_from(["inputs", "instances", "instances row"]))
    value = draw(nested())
    doc[key.split()[0]] = [value] if key == "instances row" else value
    return doc


@st.composite
def rest_predicts(draw) -> tuple[str, str, bytes]:
    """:predict bodies: mostly documents of the signatures' shapes, deep documents, any JSON, and
    rarely (each is 16 MiB) a body at the size limit."""
    form = draw(st.sampled_from(["docs", "deep", "json", "big"]))
    if form == "big" and not draw(one_in(10)):
        form = "docs"
    body = draw({"docs": json_bodies(predict_docs()), "deep": json_bodies(deep_docs()), "json": json_bodies(JSON),
                 "big": big_bodies()}[form])
    return "POST", f"/v1/models/{MODEL}:predict", body


@st.composite
def example_objects(draw):
    """A classify/regress example: features as scalars, lists, b64 objects, nested lists, null."""
    features = {"bill_length_mm": 40.0, "flipper_length_mm": 190, "island": "Dream"} if draw(st.booleans()) else {}
    for name in draw(st.lists(FEATURE_NAMES, max_size=3)):
        features[name] = draw(st.one_of(LEAVES, st.lists(LEAVES, max_size=3), JSON))
    return features


@st.composite
def rest_examples(draw) -> tuple[str, str, bytes]:
    """:classify and :regress bodies: `examples` (objects, junk, empty, missing) and `context`."""
    verb = draw(st.sampled_from(["classify", "regress"]))
    doc = {}
    if draw(st.booleans()):
        doc["signature_name"] = draw(mostly(st.sampled_from(["regress_body_mass_g", "classify_species", ""]), LEAVES))
    if draw(mostly(st.just(True), st.just(False))):
        doc["examples"] = draw(mostly(st.lists(example_objects(), min_size=1, max_size=3), st.one_of(st.just([]), JSON)))
    if draw(one_in(3)):
        doc["context"] = draw(st.one_of(example_objects(), JSON))
    return "POST", f"/v1/models/{MODEL}:{verb}", draw(json_bodies(st.just(doc)))


# -- REST paths ------------------------------------------------------------------------------------
def quoted(text: str) -> str:
    return urllib.parse.quote(text, safe="")


PATH_PARTS = st.one_of(st.just(MODEL), st.sampled_from(["", "nope", "%00", "%2F", "%ZZ", "..", "%", "p%C3%A9"]),
                       TEXT.map(quoted))


@st.composite
def rest_paths(draw) -> tuple[str, str, bytes]:
    """Any method on /v1/models/... paths: versions (huge, negative, not numbers), labels,
    percent-encoding, suffixes and verbs in any case, query strings, very long paths."""
    method = draw(mostly(st.sampled_from(["GET", "POST"]), st.sampled_from(["PUT", "DELETE", "HEAD", "OPTIONS",
                                                                           "PATCH", "TRACE", "BREW"])))
    prefix = draw(mostly(st.just("/v1/models/"), st.sampled_from(["/v1/models", "/v1/", "/v2/models/", "//v1/models/",
                                                                  "/V1/MODELS/", "/", "/monitoring/prometheus/metrics"])))
    path = prefix + draw(PATH_PARTS)
    version = draw(st.sampled_from(["", "versions", "labels"]))
    if version == "versions":
        path += "/versions/" + draw(st.one_of(st.sampled_from(["1", "0", "01", "-1", "", "9" * 19, "9" * 40, "1.5"]),
                                              PATH_PARTS))
    elif version == "labels":
        path += "/labels/" + draw(PATH_PARTS)
    path += draw(st.sampled_from(["", "/metadata", ":predict", ":classify", ":regress", ":PREDICT", ":nope", "/",
                                  ":", "/metadata:predict"]))
    if draw(one_in(10)):
        path += "?" + quoted(draw(TEXT))
    if draw(one_in(15)):
        path += "/" + "a" * draw(st.sampled_from([1000, 8000, 20_000, 70_000]))
    body = draw(st.sampled_from([b"", to_json({"instances": [B64_EXAMPLE]}).encode()])) if method != "GET" else b""
    return method, path, body


# -- raw HTTP exchanges ----------------------------------------------------------------------------
VALID_BODY = to_json({"instances": [B64_EXAMPLE]}).encode()
GZIP_BOMB = gzip.compress(b" " * (64 * 1024 * 1024))  # 64 MiB of spaces in ~64 KiB


@st.composite
def request_lines(draw) -> bytes:
    method = draw(mostly(st.just(b"POST"), st.sampled_from([b"GET", b"post", b"", b"P\x00ST", b"\xff", b"CONNECT",
                                                             b"PRI", b"G E T"])))
    target = draw(mostly(st.just(f"/v1/models/{MODEL}:predict".encode()), st.one_of(
        st.sampled_from([b"*", b"", b"http://127.0.0.1/v1/models/penguins", b"/v1/models/pen guins:predict",
                         b"/v1/models/\x00:predict", b"/\xff\xfe", b"/v1/models/penguins:predict#frag", b"//"]),
        st.binary(max_size=24), st.sampled_from([1000, 20_000, 100_000]).map(lambda n: b"/" + b"a" * n))))
    version = draw(mostly(st.just(b"HTTP/1.1"), st.sampled_from([b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1x", b"",
                                                                 b"HTTP/01.1", b"http/1.1", b"HTTP/1.1 extra"])))
    return method + b" " + target + b" " + version


@st.composite
def chunked(draw, body: bytes) -> bytes:
    """`body` in chunks, with a bad chunk size, extension, missing CRLF or end, or trailers."""
    at = draw(st.integers(0, len(body)))
    parts = [b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:at], body[at:]) if p]
    fault = draw(mostly(st.just("none"), st.sampled_from(["size", "extension", "crlf", "end", "trailer"])))
    if fault == "size" and parts:
        parts[0] = draw(st.sampled_from([b"zz", b"-1", b"f" * 20, b"", b"0x10", b" 1"])) + parts[0][parts[0].index(b"\r\n"):]
    elif fault == "extension" and parts:
        parts[0] = parts[0].replace(b"\r\n", b';x="y' + b"e" * draw(st.sampled_from([1, 100_000])) + b'"\r\n', 1)
    elif fault == "crlf" and parts:
        parts[-1] = parts[-1][:-2]
    end = {"end": b"", "trailer": b"0\r\nX-Trailer: 1\r\n\r\n"}.get(fault, b"0\r\n\r\n")
    return b"".join(parts) + end


HEADER_JUNK = [b"NoColon", b" Leading: space", b"Bad Name: x", b"X-Nul: a\x00b", b"X-Ctl: \x01\x7f", b"X-Bytes: \xff\xfe",
               b"X-Fold: a\r\n  folded", b": empty-name", b"X-Empty:", b"Expect: 100-continue", b"Connection: close",
               b"Connection: upgrade\r\nUpgrade: h2c", b"Upgrade: websocket", b"Content-Type: text/plain",
               b"Content-Encoding: gzip", b"Host:", b"Host: a\r\nHost: b", b"Transfer-Encoding: gzip, chunked"]
LENGTHS = [b"-1", b"-0", b"18446744073709551616", b"9" * 30, b"+5", b" 5 ", b"0x10", b"abc", b"", b"1, 2", b"0"]


@st.composite
def http_requests(draw) -> bytes:
    """One request's bytes: the request line, Host, a body framed by Content-Length (right, wrong,
    duplicated, negative, huge, not a number) or chunked, junk headers, very long or many headers."""
    body = draw(st.one_of(st.just(VALID_BODY), st.just(GZIP_BOMB), st.binary(max_size=64), st.just(b"")))
    headers = [b"Host: 127.0.0.1"]
    framing = draw(st.sampled_from(["length", "chunked", "both", "none"]))
    if framing in ("length", "both"):
        length = draw(mostly(st.just(b"%d" % len(body)), st.sampled_from(LENGTHS)))
        headers.append(b"Content-Length: " + length)
        if draw(one_in(6)):
            headers.append(b"Content-Length: " + draw(st.sampled_from([length, b"%d" % (len(body) + 1)])))
    if framing in ("chunked", "both"):
        headers.append(b"Transfer-Encoding: " + draw(mostly(st.just(b"chunked"), st.sampled_from(
            [b"Chunked", b"chunked, chunked", b"identity", b"chunked\x00", b"xchunked"]))))
        body = draw(chunked(body))
    headers += draw(st.lists(st.sampled_from(HEADER_JUNK), max_size=3))
    if draw(one_in(10)):
        headers.append(b"X-Long: " + b"v" * draw(st.sampled_from([10_000, 70_000])))
    if draw(one_in(10)):
        headers += [b"X-Many-%d: 1" % i for i in range(draw(st.sampled_from([101, 1000])))]
    newline = draw(mostly(st.just(b"\r\n"), st.sampled_from([b"\n", b"\r"])))
    return draw(request_lines()) + newline + newline.join(headers) + newline + newline + body


@st.composite
def http_exchanges(draw) -> tuple[bytes, str]:
    """(bytes, then): one to four pipelined requests, maybe cut anywhere; then the client
    half-closes (and waits for the server to close) or closes at once."""
    data = b"".join(draw(st.lists(http_requests(), min_size=1, max_size=4)))
    if draw(one_in(4)):
        data = data[:draw(st.integers(0, len(data)))]
    return data, draw(st.sampled_from(["half_close", "close"]))


@st.composite
def unfinished_heads(draw) -> bytes:
    """A request head cut before its blank line: a server must not wait for the rest forever."""
    head = f"POST /v1/models/{MODEL}:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(VALID_BODY)}\r\n\r\n"
    head = head.encode()
    return head[:draw(st.integers(1, len(head) - 3))] + draw(st.sampled_from([b"", b"X-Slow: 1"]))


def valid_predict() -> predict_pb2.PredictRequest:
    """The request the server must still answer between cases: one serialized example."""
    request = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(name=MODEL))
    request.inputs["inputs"].CopyFrom(valid_tensor("inputs"))
    return request
