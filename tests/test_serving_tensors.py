"""TensorProto <-> NumPy in the server: values and shapes survive the round trip, and a malformed
proto is refused with INVALID_ARGUMENT naming the input before anything large is allocated."""
from __future__ import annotations

import grpc
import numpy as np
import pytest
import tensorflow as tf

from serving.errors import ServingError
from serving.request_limits import RequestLimits
from serving.tensors import from_numpy, to_numpy


def _budget():
    return RequestLimits(max_elements=100).budget()


@pytest.mark.parametrize("array", [
    np.arange(6, dtype=np.float32).reshape(2, 3),
    np.array([[1, -2]], np.int64),
    np.array([True, False]),
    np.array([[b"a", b"bc"]], dtype=object),
])
def test_round_trip(array):
    back = to_numpy(from_numpy(array), "x", _budget())
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)
    # TensorFlow reads what we write, and we read what TensorFlow writes (*_val fields for small lists).
    np.testing.assert_array_equal(tf.make_ndarray(from_numpy(array)), array)
    np.testing.assert_array_equal(to_numpy(tf.make_tensor_proto(array.tolist()), "x", _budget()), array)


def test_text_outputs_are_written_as_utf8_bytes():
    for array in (np.array(["é", "b"]), np.array(["é", b"b"], dtype=object)):
        assert list(from_numpy(array).string_val) == ["é".encode(), b"b"]


INVALID, OVER = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize("mutate, message, code", [
    (lambda p: p.tensor_shape.dim.add(size=-1), "negative dimension", INVALID),
    (lambda p: p.tensor_shape.dim.add(size=10**12), "more than 100 values, the limit", OVER),
    (lambda p: [p.tensor_shape.dim.add(size=2**62) for _ in range(2)], "more than 100 values, the limit", OVER),
    (lambda p: setattr(p, "tensor_content", b"\0" * 3), "tensor_content has 3 bytes", INVALID),
    # More dimensions than TensorFlow's Python bridge takes (a string array of 33 crashed it).
    (lambda p: [p.tensor_shape.dim.add(size=1) for _ in range(32)], "33 dimensions; a request tensor may have at most 32",
     INVALID),
    # A million dimensions: refused from the count, before the dims are read into a list.
    (lambda p: p.tensor_shape.dim.extend([p.tensor_shape.dim[0]] * 10**6), "1000001 dimensions", INVALID),
])
def test_malformed_protos_are_refused(mutate, message, code):
    proto = from_numpy(np.zeros(4, np.float32))
    mutate(proto)
    with pytest.raises(ServingError, match=message) as caught:
        to_numpy(proto, "x", _budget())
    assert caught.value.code == code and "input 'x'" in caught.value.message


def test_the_element_budget_is_shared_by_a_requests_tensors():
    budget = _budget()
    to_numpy(from_numpy(np.zeros(60, np.float32)), "a", budget)
    with pytest.raises(ServingError, match="input 'b': shape \\[60\\] has more than 40 values") as caught:
        to_numpy(from_numpy(np.zeros(60, np.float32)), "b", budget)
    assert caught.value.http_status == 413  # over a limit: REST's "too large", not the 429 of a full queue


@pytest.mark.parametrize("array", [
    np.array([[1.5, -np.inf], [np.nan, 3e38]], np.float32),
    np.array([0.1, 2.0**60], np.float64),
    np.array([[-2**31, 2**31 - 1]], np.int32),
    np.array([-2**63, 2**63 - 1, 0], np.int64),
    np.array([7, 255], np.uint8),
    np.array([[True], [False]]),
    np.array([1.5, -0.25], np.float16),
    np.array([[b"a", b""], [b"\xff", b"bc"]], dtype=object),
])
def test_typed_value_fields_are_read(array):
    # What clients other than TensorFlow's Python send: values in the repeated *_val fields
    # (from_numpy's as_fields, TF Serving's own answer format), not in tensor_content.
    proto = from_numpy(array, as_fields=True)
    assert not proto.tensor_content
    back = to_numpy(proto, "x", _budget())
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)


def test_one_typed_value_fills_the_shape():
    proto = from_numpy(np.array([4.0], np.float32), as_fields=True)
    proto.tensor_shape.dim[0].size = 3
    np.testing.assert_array_equal(to_numpy(proto, "x", _budget()), np.full(3, 4.0, np.float32))
    proto.float_val.append(5.0)  # two values for three elements: refused
    with pytest.raises(ServingError, match="needs 3 values, got 2"):
        to_numpy(proto, "x", _budget())


@pytest.mark.parametrize("dtype, values", [
    (tf.int8, [300, -129, 5]), (tf.uint8, [-1, 256, 7]), (tf.int16, [70000, -5]),
    (tf.float16, [0x3C00 + 65536, -1, 0x3C00]),  # half_val holds a half's 16 bits
])
def test_int32_value_fields_are_cut_as_tensorflow_reads_them(dtype, values):
    # int8, int16, uint8 (int_val) and float16 (half_val) travel as int32s; TensorFlow's C++
    # (Tensor::FromProto, what TF Serving parses a request with) casts each one to the narrower
    # type. A Const node holding the same proto, run by a Session, is that C++ parse.
    proto = tf.make_tensor_proto(0, dtype=dtype, shape=[len(values)])
    field = proto.half_val if dtype == tf.float16 else proto.int_val
    del field[:]
    field.extend(values)
    graph_def = tf.compat.v1.GraphDef()
    node = graph_def.node.add(name="c", op="Const")
    node.attr["dtype"].type = dtype.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(proto)
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as session:
            expected = session.run("c:0")
    read = expected.view(np.uint16) if dtype == tf.float16 else expected  # a half's bits
    assert list(read) != values  # the case: values outside the narrow type
    back = to_numpy(proto, "x", _budget())
    assert back.dtype == expected.dtype
    np.testing.assert_array_equal(back, expected)
