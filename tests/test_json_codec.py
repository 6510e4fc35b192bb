"""TF Serving's JSON codec (util/json_tensor.cc) on arrays: what the answers look like, and the
request forms the conformance table does not reach through a model."""
from __future__ import annotations

import json

import numpy as np
import pytest
from tensorflow.core.framework import types_pb2

from serving import json_codec
from serving.errors import ServingError
from serving.request_limits import RequestLimits

LIMITS = RequestLimits()
BUDGET = LIMITS.budget


def test_answers_row_and_columnar():
    outputs = {"scores": np.array([[0.1, 0.9], [0.5, 0.5]], np.float32), "ids": np.array([7, 8], np.int64),
               "image_bytes": np.array([b"\xff\x00", b"ok"], dtype=object)}
    row = json_codec.predict_answer(outputs, row_format=True)
    # float32 values by their shortest decimal form (0.1, not 0.10000000149011612), as WriteDecimal.
    assert row == {"predictions": [{"ids": 7, "image_bytes": {"b64": "/wA="}, "scores": [0.1, 0.9]},
                                   {"ids": 8, "image_bytes": {"b64": "b2s="}, "scores": [0.5, 0.5]}]}
    assert json_codec.predict_answer({"scores": outputs["scores"]}, row_format=True) == {"predictions": [[0.1, 0.9], [0.5, 0.5]]}
    assert json_codec.predict_answer({"scores": outputs["scores"]}, row_format=False) == {"outputs": [[0.1, 0.9], [0.5, 0.5]]}
    assert json_codec.predict_answer({"empty": np.zeros((2, 0), np.float32)}, row_format=False) == {"outputs": [[], []]}
    # NaN and infinities are written as TF Serving's tokens.
    assert json_codec.dumps({"outputs": [float("nan"), float("inf"), -float("inf")]}) == b'{"outputs":[NaN,Infinity,-Infinity]}'
    with pytest.raises(ServingError, match="Tensor name: s has no shape information"):
        json_codec.predict_answer({"s": np.float32(1.0), "t": np.array([1.0], np.float32)}, row_format=True)
    with pytest.raises(ServingError, match="Tensor name: t has inconsistent batch size: 1 expecting: 2"):
        json_codec.predict_answer({"s": np.zeros(2, np.float32), "t": np.array([1.0], np.float32)}, row_format=True)


def test_tensors_in():
    doc = json.loads('{"inputs": {"x": [[1, 2.5], [NaN, -Infinity]], "n": [3], "b": [true], "s": [{"b64": "YQ=="}, "b"]}}')
    dtypes = {"x": types_pb2.DT_FLOAT, "n": types_pb2.DT_INT64, "b": types_pb2.DT_BOOL, "s": types_pb2.DT_STRING}
    inputs, row_format = json_codec.predict_inputs(doc, dtypes, "", BUDGET())
    assert not row_format and inputs["x"].dtype == np.float32 and inputs["x"].shape == (2, 2)
    assert np.isnan(inputs["x"][1, 0]) and inputs["x"][1, 1] == -np.inf
    assert inputs["n"].tolist() == [3] and inputs["b"].tolist() == [True] and inputs["s"].tolist() == [b"a", b"b"]
    for value, dtype in ((1.5, types_pb2.DT_INT64), (True, types_pb2.DT_INT32), (1, types_pb2.DT_STRING), ("1", types_pb2.DT_FLOAT)):
        with pytest.raises(ServingError, match=r"is not of expected type"):
            json_codec.tensor([value], dtype, "x", BUDGET())
    with pytest.raises(ServingError) as info:
        json_codec.tensor([1.0], types_pb2.DT_HALF, "x", BUDGET())
    assert info.value.code.name == "UNIMPLEMENTED"
    rows, _ = json_codec.predict_inputs({"instances": [[1.0, 2.0], [3.0, 4.0]]}, {"x": types_pb2.DT_DOUBLE}, "", BUDGET())
    assert rows["x"].shape == (2, 2) and rows["x"].dtype == np.float64


def test_examples_in():
    from tensorflow_serving.apis import input_pb2

    inp = input_pb2.Input()
    json_codec.fill_examples({"context": {"island": "Dream"},
                              "examples": [{"bill": 40.5, "flipper": 190, "ok": True, "img": {"b64": "YQ=="}}]}, inp)
    features = inp.example_list_with_context.examples[0].features.feature
    assert features["bill"].float_list.value == [40.5] and features["flipper"].int64_list.value == [190]
    assert features["ok"].int64_list.value == [1] and features["img"].bytes_list.value == [b"a"]
    assert inp.example_list_with_context.context.features.feature["island"].bytes_list.value == [b"Dream"]


@pytest.mark.parametrize("body, doc", [
    (b'\xef\xbb\xbf{"a": 1}', {"a": 1}),  # a UTF-8 BOM is skipped, as RapidJSON's UTF-8 stream does
    (b' {"a": 1} {"b": 2} junk', {"a": 1}),  # kParseStopWhenDoneFlag: what follows the document is not read
    (b'{"a": [NaN, Infinity, -Infinity]}', None),  # kParseNanAndInfFlag
    (b'{"a": 123456789012345678901234567890}', {"a": 1.2345678901234568e29}),  # past uint64: a double, as RapidJSON
    (b'{"a": 18446744073709551615}', {"a": 2**64 - 1}),  # uint64 stays an integer
    (b'{"a": "\\ud83d\\ude00"}', {"a": "\U0001F600"}),  # a surrogate pair is one character
    (b'{"a":' + b"[" * 254 + b"]" * 254 + b"}", None),  # 255 levels: the deepest taken
])
def test_bodies_tf_serving_takes(body, doc):
    parsed = json_codec.parse_body(body, LIMITS.max_elements)
    if doc is not None:
        assert parsed == doc
    assert isinstance(parsed, dict)


@pytest.mark.parametrize("body, message", [
    (b"", "JSON Parse error: The document is empty"),
    (b" \n", "JSON Parse error: The document is empty. at offset: 2"),
    (b'{"a":', "JSON Parse error: Expecting value at offset: 5"),
    (b"[1, 2]", "JSON Value: [1,2] Is not object"),
    (b'{"a": ' + b"1" * 5000 + b"}", "JSON Parse error: Number too big to be stored in double."),  # Python: ValueError
    (b'{"a": "\\ud800"}', "JSON Parse error: The surrogate pair in string is invalid."),  # Python: a str UTF-8 cannot hold
    (b'{"a": "\\udc00x"}', "JSON Parse error: The surrogate pair in string is invalid."),
    (b'{"a": "\xff\xfe"}', "JSON Parse error: Invalid encoding in string. at offset: 7"),
    (b'{"a":' + b"[" * 255 + b"]" * 255 + b"}", "JSON Parse error: the document nests deeper than 255 levels"),
    (b"[" * 200_000 + b"]" * 200_000, "JSON Parse error: the document nests deeper than 255 levels"),  # Python: RecursionError
    (b'{"a": [1, [[[' + b"[" * 300 + b"]" * 300 + b"]]]]}", "JSON Parse error: the document nests deeper than 255 levels"),
])
def test_malformed_bodies_are_invalid_argument_with_tf_servings_message_family(body, message):
    with pytest.raises(ServingError) as info:
        json_codec.parse_body(body, LIMITS.max_elements)
    assert (info.value.code.name, info.value.message) == ("INVALID_ARGUMENT", message)
