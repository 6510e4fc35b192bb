"""One loaded TFLite version: a version folder's `model.tflite` run through a pool of LiteRT
interpreters, as TF Serving serves it with --prefer_tflite_model (serving.prefer_tflite in
loopline's mode). It has the interface of serving.servable.Servable that the API code uses, so
Predict/Classify/Regress/MultiInference/metadata answer through the same rules.

TF Serving's rules, and where they come from:
- `model.tflite` next to (or instead of) saved_model.pb is loaded when preferred; without it the
  SavedModel is (saved_model_bundle_factory.cc: kTfLiteModelFilename, TfLiteModelFound).
- SignatureDefs (tflite_session.cc, TfLiteSession::Create): those stored in the model's
  `signature_defs_metadata` (tflite::GetSignatureDefMap), each tensor name checked against the
  model's tensors, or else its legacy name without `:0` (FixTfLiteTensorName); without them, one
  `serving_default` (method predict) whose inputs and outputs are the model's tensors, named
  without `:0`. Between the two, loopline reads the converter's own signatures (the
  SignatureRunner's, which TF Serving r2.19 does not read): a model converted from a SavedModel's
  signature is then served under that signature's key and names, not as its tensors.
- Types (TfLiteTypeToTfType): float32, int32, uint8, int64, string, bool, int16, complex64, int8;
  a model with any other input or output type is refused at load.
- A run (SetInputAndInvokeMiniBatch): an input whose shape differs from the interpreter's tensor
  is resized to the request's shape, then the tensors are allocated again; TF Serving answers
  INTERNAL when that fails. Here a request the interpreter cannot take (wrong dtype, a shape it
  cannot resize to or compute) is INVALID_ARGUMENT, saying which signature and why.
- The pool (tflite_interpreter_pool.cc): an interpreter runs one call at a time, so each call
  takes one from the pool and gives it back; the pool has --num_tflite_pools interpreters (TF
  Serving's default: one per CPU), serving.tflite_interpreters in loopline's mode.
"""
from __future__ import annotations

import logging
import os
import queue

import grpc
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2

from serving import signature_names as names
from serving.config import BatchingConfig
from serving.errors import ServingError, invalid, not_found
from serving.request_limits import RequestLimits
from serving.servable import LoadedVersion

log = logging.getLogger("loopline.serving")

SIGNATURE_DEFS_METADATA = "signature_defs_metadata"  # tflite/tools/signature/signature_def_util.cc
# TfLiteTypeToTfType: the TFLite types TF Serving maps to a DataType.
_SERVED_TYPES = {np.dtype(t) for t in (np.float32, np.int32, np.uint8, np.int64, np.bool_, np.int16,
                                       np.complex64, np.int8)}


def tflite_file(version_dir: str) -> str | None:
    """The version folder's `model.tflite` (TfLiteModelFound); None when there is none."""
    path = os.path.join(version_dir, names.TFLITE_MODEL_FILE)
    return path if tf.io.gfile.exists(path) else None


def legacy_name(tensor_name: str) -> str:
    """TfToTfLiteLegacyTensorName: early converters dropped TensorFlow's `:0` suffix."""
    return tensor_name.split(":", 1)[0]


class _Signature:
    """How one SignatureDef runs: its subgraph and the tensor index of each input and output alias."""
    __slots__ = ("subgraph", "inputs", "outputs")

    def __init__(self, subgraph: int, inputs: dict[str, int], outputs: dict[str, int]):
        self.subgraph, self.inputs, self.outputs = subgraph, inputs, outputs


def _tensor_info(wrapper, index: int, subgraph: int = 0) -> meta_graph_pb2.TensorInfo:
    """TfLiteTensorToTensorInfo: dtype, name and shape (the signature's, -1 where it may vary)."""
    np_type = wrapper.TensorType(index, subgraph)
    name = wrapper.TensorName(index, subgraph)
    if np_type is np.bytes_ or np.dtype(np_type).kind in "OSU":
        dtype = tf.string
    elif np.dtype(np_type) in _SERVED_TYPES:
        dtype = tf.dtypes.as_dtype(np_type)
    else:
        raise ServingError(grpc.StatusCode.INTERNAL, f"Unknown TfLite type: {np.dtype(np_type).name} (tensor {name})")
    info = meta_graph_pb2.TensorInfo(name=name, dtype=dtype.as_datatype_enum)
    for size in wrapper.TensorSizeSignature(index, subgraph):
        info.tensor_shape.dim.add(size=int(size))
    return info


def _metadata_signature_defs(content: bytes) -> dict[str, meta_graph_pb2.SignatureDef]:
    """The SignatureDefs stored in the model's metadata (tflite::GetSignatureDefMap): a flexbuffer
    map from key to a serialized SignatureDef."""
    from ai_edge_litert import schema_py_generated as schema
    from flatbuffers import flexbuffers

    try:
        model = schema.Model.GetRootAs(content, 0)
        for i in range(model.MetadataLength()):
            entry = model.Metadata(i)
            if entry.Name() != SIGNATURE_DEFS_METADATA.encode():
                continue
            data = model.Buffers(entry.Buffer()).DataAsNumpy().tobytes()
            stored = flexbuffers.GetRoot(data).AsMap
            return {key.AsKey: meta_graph_pb2.SignatureDef.FromString(value.AsStringBytes)
                    for key, value in zip(stored.Keys, stored.Values)}
    except Exception as exc:  # noqa: BLE001 - flatbuffers and protobuf raise many kinds on bad bytes
        raise invalid(f"Invalid SignatureDefs found in TfLite model: {exc}") from None
    return {}


def _fixed_index(tensors: dict[str, int], info: meta_graph_pb2.TensorInfo, what: str) -> int:
    """FixTfLiteTensorName: the tensor named as `info` says, else by its legacy name, which then
    replaces the name in `info`."""
    name = info.name
    for candidate in (name, legacy_name(name)):
        if candidate in tensors:
            info.name = candidate
            return tensors[candidate]
    raise ServingError(grpc.StatusCode.INTERNAL, f"{what} references an unknown tensor: Unknown tensor '{name}'.")


def read_signatures(content: bytes, wrapper) -> tuple[dict[str, meta_graph_pb2.SignatureDef], dict[str, _Signature]]:
    """The SignatureDefs TF Serving serves for this model and how each runs (see the module's doc)."""
    tensors = {}
    for io, indices in (("Input", wrapper.InputIndices()), ("Output", wrapper.OutputIndices())):
        named = {}
        for index in indices:
            name = wrapper.TensorName(int(index), 0)
            if name in named:  # GetTensorInfoMap
                raise ServingError(grpc.StatusCode.ALREADY_EXISTS, f"{io} tensor name: {name} has multiple indices")
            named[name] = int(index)
        tensors[io] = named
    stored = _metadata_signature_defs(content)
    if stored:
        calls = {}
        for key, signature in stored.items():
            inputs = {alias: _fixed_index(tensors["Input"], info, f"Signature input {alias}")
                      for alias, info in signature.inputs.items()}
            outputs = {alias: _fixed_index(tensors["Output"], info, f"Signature output {alias}")
                       for alias, info in signature.outputs.items()}
            calls[key] = _Signature(0, inputs, outputs)
        return stored, calls
    runners = wrapper.GetSignatureDefs()
    if runners:
        return _runner_signatures(wrapper, runners)
    log.warning("No signature def found in TFLite model. Generating one.")
    signature = meta_graph_pb2.SignatureDef(method_name=names.PREDICT_METHOD)
    inputs = {legacy_name(name): index for name, index in tensors["Input"].items()}
    outputs = {legacy_name(name): index for name, index in tensors["Output"].items()}
    for alias, index in inputs.items():
        signature.inputs[alias].CopyFrom(_tensor_info(wrapper, index))
    for alias, index in outputs.items():
        signature.outputs[alias].CopyFrom(_tensor_info(wrapper, index))
    return {names.DEFAULT: signature}, {names.DEFAULT: _Signature(0, inputs, outputs)}


def _runner_signatures(wrapper, runners: dict):
    """The converter's signatures (SignatureRunner): key, aliases and their tensors, method predict."""
    defs, calls = {}, {}
    for key, runner in runners.items():
        subgraph = wrapper.GetSubgraphIndexFromSignature(key)
        signature = meta_graph_pb2.SignatureDef(method_name=names.PREDICT_METHOD)
        for alias, index in runner["inputs"].items():
            signature.inputs[alias].CopyFrom(_tensor_info(wrapper, index, subgraph))
        for alias, index in runner["outputs"].items():
            signature.outputs[alias].CopyFrom(_tensor_info(wrapper, index, subgraph))
        defs[key] = signature
        calls[key] = _Signature(subgraph, dict(runner["inputs"]), dict(runner["outputs"]))
    return defs, calls


class _Interpreter:
    """One pooled interpreter and the input shapes it is allocated for (resizing only on change)."""
    __slots__ = ("interpreter", "wrapper", "shapes")

    def __init__(self, content: bytes):
        from ai_edge_litert.interpreter import Interpreter

        # Kept: it holds the model's bytes, which the C++ interpreter reads in place.
        self.interpreter = Interpreter(model_content=content, num_threads=1)
        self.wrapper = self.interpreter._interpreter  # noqa: SLF001 - the C++ wrapper: no Python checks per call
        self.shapes: dict[tuple[int, int], tuple] = {}
        self.wrapper.AllocateTensors(-1)


class TfLiteServable(LoadedVersion):
    call_mode = "the TFLite interpreter (model.tflite)"

    def __init__(self, name: str, version: int, path: str, batching: BatchingConfig | None, limits: RequestLimits,
                 interpreters: int):
        self.name, self.version, self.path = name, version, path
        self.limits = limits
        model_file = tflite_file(path)
        if model_file is None:
            raise not_found(f"Could not find {names.TFLITE_MODEL_FILE} in {path}")
        with tf.io.gfile.GFile(model_file, "rb") as f:
            content = f.read()
        try:
            first = _Interpreter(content)
        except (ValueError, RuntimeError) as exc:
            raise ServingError(grpc.StatusCode.INTERNAL, f"Cannot build Interpreter from buffer: {exc}") from None
        self._content = content  # for an interpreter replacing one whose call failed
        self.all_signature_defs, self._signatures = read_signatures(content, first.wrapper)
        self.signature_defs = self.all_signature_defs
        self.description = {}
        self._pool: queue.SimpleQueue[_Interpreter] = queue.SimpleQueue()
        self._pool.put(first)
        for _ in range(max(interpreters, 1) - 1):
            self._pool.put(_Interpreter(content))
        self._init_shared(self._signatures, batching)

    def unload(self) -> None:
        self._signatures = {}
        while not self._pool.empty():
            self._pool.get_nowait()

    def _call(self, key: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        signature = self._signatures[key]
        interpreter = self._pool.get()
        try:
            return _invoke(interpreter, signature, inputs)
        except (ValueError, RuntimeError) as exc:
            # A fresh one replaces it: a failed allocation leaves its tensors unallocated, and its
            # error reporter would repeat this error's words for the next failure.
            interpreter = _Interpreter(self._content)
            shapes = ", ".join(f"{alias} {list(array.shape)}" for alias, array in sorted(inputs.items()))
            raise invalid(f"signature '{key}': the TFLite interpreter cannot run inputs of shapes {shapes}: "
                          f"{str(exc).strip()}") from None
        finally:
            self._pool.put(interpreter)


def _invoke(interpreter: _Interpreter, signature: _Signature, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """SetInputAndInvokeMiniBatch, then the outputs copied out (SetMiniBatchOutput)."""
    wrapper, subgraph, shapes = interpreter.wrapper, signature.subgraph, interpreter.shapes
    resized = False
    for alias, array in inputs.items():
        index = signature.inputs[alias]
        if shapes.get((subgraph, index)) != array.shape:
            wrapper.ResizeInputTensor(index, np.array(array.shape, dtype=np.int32), False, subgraph)
            resized = True
    if resized:
        wrapper.AllocateTensors(subgraph)
        for alias, array in inputs.items():
            shapes[(subgraph, signature.inputs[alias])] = array.shape
    for alias, array in inputs.items():
        wrapper.SetTensor(signature.inputs[alias], array, subgraph)
    wrapper.Invoke(subgraph)
    return {alias: wrapper.GetTensor(index, subgraph) for alias, index in signature.outputs.items()}
