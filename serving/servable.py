"""One loaded model version: its signatures, input checks and calls (batched or not)."""
from __future__ import annotations

import json
import logging
import threading

import numpy as np
import tensorflow as tf

from serving import signature_names as names
from serving.batching import Batcher
from serving.config import BatchingConfig
from serving.errors import invalid
from serving.signature_call import SignatureCallers, read_signature_defs
from serving.tensors import dtype_name

log = logging.getLogger("loopline.serving")



class Servable:
    def __init__(self, name: str, version: int, path: str, batching: BatchingConfig | None, max_elements: int,
                 intra_op_threads: int = 0):
        self.name, self.version, self.path = name, version, path
        self.max_elements = max_elements
        # Every SignatureDef, as GetModelMetadata lists them; the callable ones (not `__...`).
        self.all_signature_defs = read_signature_defs(path)
        self.signature_defs = {k: v for k, v in self.all_signature_defs.items() if not k.startswith("__")}
        self._callers = SignatureCallers(path, self.signature_defs, intra_op_threads)
        self._functions = self._callers.callers
        self.call_mode = self._callers.mode
        self.description = {}
        sig_file = names.signature_file(path)
        if tf.io.gfile.exists(sig_file):
            with tf.io.gfile.GFile(sig_file) as f:
                self.description = json.loads(f.read())
        self._specs: dict[str, dict[str, tuple]] = {}
        self._batchers = {}
        if batching is not None and batching.enabled:
            for key in self._functions:
                self._batchers[key] = Batcher(
                    lambda inputs, key=key: self._call(key, inputs), batching.max_batch_size,
                    batching.num_batch_threads, batching.max_enqueued_batches)
        self._in_flight = 0
        self._idle = threading.Condition()

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

    def check_inputs(self, key: str, inputs: dict[str, np.ndarray]) -> None:
        """Dtypes and shapes against the signature (INVALID_ARGUMENT, as TF Serving's Session run
        answers); the request rules (serving/rules.py) checked the names before."""
        specs = self._input_specs(key)
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

    def run(self, key: str, inputs: dict[str, np.ndarray], fetch=None) -> dict[str, np.ndarray]:
        """Runs signature `key` (batched with concurrent calls when batching is on); `fetch`:
        the outputs wanted (None: all)."""
        self.check_inputs(key, inputs)
        batcher = self._batchers.get(key)
        outputs = batcher.submit(inputs) if batcher else self._call(key, inputs)
        if fetch is not None:
            outputs = {k: outputs[k] for k in fetch}
        return outputs


