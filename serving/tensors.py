"""TensorProto <-> NumPy without going through TensorFlow: `tensor_content` is read and written
as raw bytes (one copy), and every size is checked (serving/request_limits.py) before anything is
allocated, so a proto claiming a huge shape or rank is refused instead of exhausting memory or
crashing TensorFlow's Python bridge."""
from __future__ import annotations

import numpy as np
from tensorflow.core.framework import tensor_pb2, types_pb2

from serving.errors import invalid
from serving.request_limits import ElementBudget

# dtype enum -> (numpy dtype, the repeated *_val field holding values when tensor_content is empty)
_DTYPES = {
    types_pb2.DT_FLOAT: (np.float32, "float_val"),
    types_pb2.DT_DOUBLE: (np.float64, "double_val"),
    types_pb2.DT_INT32: (np.int32, "int_val"),
    types_pb2.DT_INT16: (np.int16, "int_val"),
    types_pb2.DT_INT8: (np.int8, "int_val"),
    types_pb2.DT_UINT8: (np.uint8, "int_val"),
    types_pb2.DT_INT64: (np.int64, "int64_val"),
    types_pb2.DT_BOOL: (np.bool_, "bool_val"),
    types_pb2.DT_HALF: (np.float16, "half_val"),
}
_NUMPY_TO_DT = {np.dtype(v[0]): k for k, v in _DTYPES.items()}


def dtype_name(dtype_enum: int) -> str:
    try:
        return types_pb2.DataType.Name(dtype_enum)[3:].lower()
    except ValueError:
        return f"dtype#{dtype_enum}"


def to_numpy(proto: tensor_pb2.TensorProto, name: str, budget: ElementBudget) -> np.ndarray:
    """The array a TensorProto describes; INVALID_ARGUMENT naming `name` when it is malformed,
    RESOURCE_EXHAUSTED when over the request's element budget."""
    shape_proto = proto.tensor_shape
    if shape_proto.unknown_rank:
        raise invalid(f"input '{name}': tensor_shape has unknown rank")
    dims = shape_proto.dim
    if len(dims) > budget.max_rank:  # before the dims are read: a proto may hold millions
        budget.check_rank(name, len(dims))
    shape = [d.size for d in dims]
    count = budget.take(name, shape)
    dtype = proto.dtype
    if dtype == types_pb2.DT_STRING:
        values = proto.string_val
        if len(values) == count:
            return np.fromiter(values, object, count).reshape(shape)
        if len(values) == 1:
            return np.full(shape, values[0], dtype=object)
        raise invalid(f"input '{name}': shape {shape} needs {count} strings, got {len(values)}")
    known = _DTYPES.get(dtype)
    if known is None:
        raise invalid(f"input '{name}': unsupported dtype {dtype_name(dtype)}")
    np_dtype, field = known
    content = proto.tensor_content
    if content:
        itemsize = np.dtype(np_dtype).itemsize
        if len(content) != count * itemsize:
            raise invalid(f"input '{name}': tensor_content has {len(content)} bytes; "
                          f"shape {shape} of {dtype_name(dtype)} needs {count * itemsize}")
        return np.frombuffer(content, dtype=np_dtype).reshape(shape)
    values = getattr(proto, field)
    if field in ("int_val", "half_val"):
        # int32s on the wire for int8/16, uint8 and float16 (its bits): TensorFlow's C++
        # (Tensor::FromProto) casts each one to the narrower type, and so does this
        array = np.fromiter(values, np.int32, len(values))
        array = array.astype(np.uint16).view(np.float16) if field == "half_val" else array.astype(np_dtype, copy=False)
    else:  # fromiter with the count: half the time of np.array on a repeated field
        array = np.fromiter(values, np_dtype, len(values))
    if array.size == count:
        return array.reshape(shape)
    if array.size == 1:
        return np.full(shape, array[0], dtype=np_dtype)
    raise invalid(f"input '{name}': shape {shape} needs {count} values, got {array.size}")


def numpy_dtype_enum(dtype: np.dtype) -> int:
    """The DataType enum of a numeric numpy dtype (DT_INVALID when there is none)."""
    return _NUMPY_TO_DT.get(np.dtype(dtype), types_pb2.DT_INVALID)


def from_numpy(array: np.ndarray, out: tensor_pb2.TensorProto | None = None, as_fields: bool = False) -> tensor_pb2.TensorProto:
    """`as_fields`: values in the typed repeated field (float_val, int64_val...), as TF Serving
    writes its Predict answers (Tensor::AsProtoField, its default); otherwise in tensor_content."""
    proto = out if out is not None else tensor_pb2.TensorProto()
    if proto.HasField("tensor_shape"):
        proto.tensor_shape.Clear()
    dims = proto.tensor_shape.dim
    for s in array.shape:
        dims.add(size=s)
    if array.dtype == object or array.dtype.kind in "SU":
        proto.dtype = types_pb2.DT_STRING
        values = array.reshape(-1).tolist()
        try:
            proto.string_val.extend(values)  # the usual case: TensorFlow's string outputs are bytes
        except TypeError:
            del proto.string_val[:]
            proto.string_val.extend(v if isinstance(v, bytes) else str(v).encode() for v in values)
        return proto
    dtype = _NUMPY_TO_DT.get(array.dtype)
    if dtype is None:
        raise invalid(f"cannot encode an output of numpy dtype {array.dtype}")
    proto.dtype = dtype
    if not as_fields:
        proto.tensor_content = np.ascontiguousarray(array).tobytes()
    elif dtype == types_pb2.DT_HALF:
        proto.half_val.extend(array.reshape(-1).view(np.uint16).tolist())
    else:
        getattr(proto, _DTYPES[dtype][1]).extend(array.reshape(-1).tolist())
    return proto
