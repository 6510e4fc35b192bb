"""One loaded model version: its signatures, input checks, calls (batched or not) and warmup."""
from __future__ import annotations

import json
import logging
import os
import threading
import time

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2
from tensorflow_serving.apis import input_pb2, prediction_log_pb2

from serving.batching import Batcher
from serving.config import BatchingConfig
from serving.errors import ServingError, invalid
from serving.signature_call import SignatureCallers
from serving.tensors import dtype_name, to_numpy

log = logging.getLogger("loopline.serving")

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
SIGNATURE_FILE = os.path.join("assets.extra", "loopline_signature.json")
DEFAULT_SIGNATURE = "serving_default"


def _examples(inp: input_pb2.Input) -> np.ndarray:
    """An Input (example list, optionally with a shared context) as serialized tf.Examples."""
    kind = inp.WhichOneof("kind")
    if kind == "example_list":
        examples = inp.example_list.examples
        return np.array([e.SerializeToString() for e in examples], dtype=object)
    if kind == "example_list_with_context":
        context = inp.example_list_with_context.context
        out = []
        for e in inp.example_list_with_context.examples:
            merged = type(e)()
            merged.CopyFrom(context)
            merged.MergeFrom(e)  # the example's own features win over the context's
            out.append(merged.SerializeToString())
        return np.array(out, dtype=object)
    raise invalid("input has neither example_list nor example_list_with_context")


class Servable:
    def __init__(self, name: str, version: int, path: str, batching: BatchingConfig | None, max_elements: int,
                 intra_op_threads: int = 0):
        self.name, self.version, self.path = name, version, path
        self.max_elements = max_elements
        self.signature_defs = self._read_signature_defs(path)
        self._callers = SignatureCallers(path, self.signature_defs, intra_op_threads)
        self._functions = self._callers.callers
        self.call_mode = self._callers.mode
        self.description = {}
        sig_file = os.path.join(path, SIGNATURE_FILE)
        if os.path.isfile(sig_file):
            with open(sig_file) as f:
                self.description = json.load(f)
        self._specs: dict[str, dict[str, tuple]] = {}
        self._batchers = {}
        if batching is not None and batching.enabled:
            for key in self._functions:
                self._batchers[key] = Batcher(
                    lambda inputs, key=key: self._call(key, inputs), batching.max_batch_size,
                    batching.num_batch_threads, batching.max_enqueued_batches)
        self._in_flight = 0
        self._idle = threading.Condition()

    @staticmethod
    def _read_signature_defs(path: str) -> dict[str, meta_graph_pb2.SignatureDef]:
        proto = saved_model_pb2.SavedModel()
        with open(os.path.join(path, "saved_model.pb"), "rb") as f:
            proto.ParseFromString(f.read())
        if not proto.meta_graphs:
            raise ValueError("saved_model.pb has no MetaGraphDef")
        return {k: v for k, v in proto.meta_graphs[0].signature_def.items() if not k.startswith("__")}

    # In-flight accounting: the manager unloads a version only once its requests have finished.
    # `acquire()` counts a request in (the manager does it while resolving the model spec);
    # leaving the `with` block counts it out.
    def acquire(self) -> "Servable":
        with self._idle:
            self._in_flight += 1
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        with self._idle:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)

    def unload(self) -> None:
        self._callers.close()  # also empties self._functions, the same dict

    def signature(self, signature_name: str) -> meta_graph_pb2.SignatureDef:
        key = signature_name or DEFAULT_SIGNATURE
        if key not in self._functions:
            raise invalid(f"Serving signature name: \"{key}\" not found in signature def; "
                          f"model {self.name} version {self.version} has {sorted(self._functions)}")
        return self.signature_defs[key]

    def _input_specs(self, key: str) -> dict[str, tuple]:
        """{input: (dtype, wants a string, numpy dtype, dims or None, the dims' known (index, size))}
        of a signature, built once."""
        specs = self._specs.get(key)
        if specs is None:
            specs = {}
            for name, info in self.signature_defs[key].inputs.items():
                want = tf.dtypes.as_dtype(info.dtype)
                dims = None if info.tensor_shape.unknown_rank else [d.size for d in info.tensor_shape.dim]
                known = tuple((i, d) for i, d in enumerate(dims or ()) if d >= 0)
                specs[name] = (want, want == tf.string, None if want == tf.string else np.dtype(want.as_numpy_dtype), dims,
                               known)
            self._specs[key] = specs
        return specs

    def check_inputs(self, signature_name: str, inputs: dict[str, np.ndarray]) -> None:
        key = signature_name or DEFAULT_SIGNATURE
        self.signature(key)
        specs = self._input_specs(key)
        if inputs.keys() != specs.keys():
            expected = set(specs)
            missing, extra = sorted(expected - set(inputs)), sorted(set(inputs) - expected)
            parts = ([f"missing {missing}"] if missing else []) + ([f"unexpected {extra}"] if extra else [])
            raise invalid(f"signature '{key}' takes inputs {sorted(expected)}: " + ", ".join(parts))
        for name, array in inputs.items():
            want, want_string, want_numpy, dims, known = specs[name]
            got_string = array.dtype == object or array.dtype.kind in "SU"
            if want_string != got_string or (not got_string and array.dtype != want_numpy):
                got = "string" if got_string else dtype_name(tf.dtypes.as_dtype(array.dtype).as_datatype_enum)
                raise invalid(f"input '{name}' of signature '{key}': expects dtype {want.name}, got {got}")
            if dims is not None:
                shape = array.shape
                if len(dims) != len(shape) or any(shape[i] != d for i, d in known):
                    raise invalid(f"input '{name}' of signature '{key}': expects shape "
                                  f"{[d if d >= 0 else -1 for d in dims]}, got {list(array.shape)}")

    def _call(self, key: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            return self._functions[key](inputs)
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as exc:
            message = getattr(exc, "message", None) or str(exc)
            raise invalid(f"model {self.name} version {self.version}, signature '{key}': {message.splitlines()[0]}") from None

    def run(self, signature_name: str, inputs: dict[str, np.ndarray], output_filter=()) -> dict[str, np.ndarray]:
        key = signature_name or DEFAULT_SIGNATURE
        self.check_inputs(key, inputs)
        sig = self.signature_defs[key]
        unknown = [o for o in output_filter if o not in sig.outputs]
        if unknown:
            raise invalid(f"output_filter {unknown} not in signature '{key}' outputs {sorted(sig.outputs)}")
        batcher = self._batchers.get(key)
        outputs = batcher.submit(inputs) if batcher else self._call(key, inputs)
        if output_filter:
            outputs = {k: outputs[k] for k in output_filter}
        return outputs

    def run_examples(self, signature_name: str, inp: input_pb2.Input) -> dict[str, np.ndarray]:
        """Classify/Regress: the signature's one string input gets the serialized examples."""
        key = signature_name or DEFAULT_SIGNATURE
        sig = self.signature(key)
        if len(sig.inputs) != 1:
            raise invalid(f"signature '{key}' takes {len(sig.inputs)} inputs; Classify/Regress need one of serialized tf.Examples")
        examples = _examples(inp)
        if len(examples) == 0:
            raise invalid("input has no examples")
        return self.run(key, {next(iter(sig.inputs)): examples})

    def warm_up(self) -> int:
        """Replays assets.extra/tf_serving_warmup_requests (PredictionLogs); returns how many."""
        path = os.path.join(self.path, WARMUP_FILE)
        if not os.path.isfile(path):
            return 0
        count = 0
        started = time.monotonic()
        for record in tf.data.TFRecordDataset(path):
            entry = prediction_log_pb2.PredictionLog.FromString(record.numpy())
            kind = entry.WhichOneof("log_type")
            if kind == "predict_log":
                req = entry.predict_log.request
                inputs = {k: to_numpy(v, k, self.max_elements) for k, v in req.inputs.items()}
                self.run(req.model_spec.signature_name, inputs)
            elif kind in ("classify_log", "regress_log"):
                req = getattr(entry, kind).request
                self.run_examples(req.model_spec.signature_name, req.input)
            else:
                continue
            count += 1
        log.info("model %s version %d: replayed %d warmup requests in %.2fs", self.name, self.version, count,
                 time.monotonic() - started)
        return count


def load_servable(name: str, version: int, path: str, batching: BatchingConfig | None, max_elements: int,
                  warmup: bool, intra_op_threads: int = 0) -> Servable:
    """Loads and warms a version; raises ServingError-free exceptions with the reason on failure."""
    servable = Servable(name, version, path, batching, max_elements, intra_op_threads)
    if warmup:
        try:
            servable.warm_up()
        except ServingError as exc:
            servable.unload()
            raise ValueError(f"warmup request failed: {exc.message}") from None
    return servable
