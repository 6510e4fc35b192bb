"""TensorProto <-> NumPy in the server: values and shapes survive the round trip, and a malformed
proto is refused with INVALID_ARGUMENT naming the input before anything large is allocated."""
from __future__ import annotations

import grpc
import numpy as np
import pytest
import tensorflow as tf

from serving.errors import ServingError
from serving.tensors import from_numpy, to_numpy


@pytest.mark.parametrize("array", [
    np.arange(6, dtype=np.float32).reshape(2, 3),
    np.array([[1, -2]], np.int64),
    np.array([True, False]),
    np.array([[b"a", b"bc"]], dtype=object),
])
def test_round_trip(array):
    back = to_numpy(from_numpy(array), "x", 100)
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)
    # TensorFlow reads what we write, and we read what TensorFlow writes (*_val fields for small lists).
    np.testing.assert_array_equal(tf.make_ndarray(from_numpy(array)), array)
    np.testing.assert_array_equal(to_numpy(tf.make_tensor_proto(array.tolist()), "x", 100), array)


def test_text_outputs_are_written_as_utf8_bytes():
    for array in (np.array(["é", "b"]), np.array(["é", b"b"], dtype=object)):
        assert list(from_numpy(array).string_val) == ["é".encode(), b"b"]


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p.tensor_shape.dim.add(size=-1), "negative dimension"),
    (lambda p: p.tensor_shape.dim.add(size=10**12), "more than 100 elements"),
    (lambda p: setattr(p, "tensor_content", b"\0" * 3), "tensor_content has 3 bytes"),
])
def test_malformed_protos_are_refused(mutate, message):
    proto = from_numpy(np.zeros(4, np.float32))
    mutate(proto)
    with pytest.raises(ServingError, match=message) as caught:
        to_numpy(proto, "x", 100)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT and "input 'x'" in caught.value.message
