"""One loaded model version: its signatures and calls (batched or not)."""
from __future__ import annotations

import json
import logging
import os
import threading

import grpc
import numpy as np
import tensorflow as tf

from serving import signature_names as names
from serving.batching import Batcher
from serving.config import BatchingConfig
from serving.errors import ServingError, invalid, not_found
from serving.model_config import saved_model_file
from serving.request_limits import RequestLimits, SpecShape, signature_shapes
from serving.signature_call import SERVE_TAGS, SignatureCallers, read_signature_defs
from serving.tensors import dtype_name

log = logging.getLogger("loopline.serving")


def check_version_dir(path: str) -> None:
    """LoadSessionBundleOrSavedModelBundle's refusals, with TF Serving's codes and texts: a Session
    Bundle (export.meta) is UNIMPLEMENTED, a folder without a SavedModel NOT_FOUND."""
    if tf.io.gfile.exists(os.path.join(path, "export.meta")):
        raise ServingError(grpc.StatusCode.UNIMPLEMENTED, "Session Bundle is deprecated and removed.")
    if saved_model_file(path) is None:
        raise not_found("Specified file path does not appear to contain a SavedModel bundle (should have a file "
                        f"called `saved_model.pb`)\nSpecified file path: {path}")


def graph_error(exc: Exception) -> ServingError:
    """An error raised running the model, with TensorFlow's own code and text, as TF Serving returns
    Session::Run's status (a Python-side argument error of the eager fallback is INVALID_ARGUMENT)."""
    if isinstance(exc, tf.errors.OpError):
        return ServingError(_STATUS_BY_NUMBER.get(exc.error_code, grpc.StatusCode.UNKNOWN), exc.message)
    return invalid(str(exc))


_STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


class LoadedVersion:
    """What every loaded version shares, whatever runs it (a SavedModel here, a TFLite model in
    serving.tflite_servable): in-flight accounting, the dtype check before a run, the signatures'
    input shapes. A subclass sets name, version, path, limits and signature_defs."""
    signature_defs: dict

    def _init_shared(self, signature_keys, batching: BatchingConfig | None) -> None:
        """The shared state; a Batcher per signature in `signature_keys` when batching is on."""
        self._batchers = {}
        if batching is not None and batching.enabled:
            for key in signature_keys:
                self._batchers[key] = Batcher(
                    lambda inputs, key=key: self._call(key, inputs), batching.max_batch_size,
                    batching.num_batch_threads, batching.max_enqueued_batches)
        self._feeds: dict[str, dict[str, tuple]] = {}
        self._shapes: dict[str, dict[str, SpecShape]] = {}
        self._in_flight = 0
        self._lock = threading.Lock()  # its C context manager: cheaper per request than a Condition's
        self._idle = threading.Condition(self._lock)
        self._idle_waiters = 0  # wait_idle calls waiting: a request wakes them only when there are any

    # In-flight accounting: the manager unloads a version only once its requests have finished.
    # `acquire()` counts a request in (the manager does it while resolving the model spec);
    # leaving the `with` block counts it out.
    def acquire(self) -> "LoadedVersion":
        with self._lock:
            self._in_flight += 1
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0 and self._idle_waiters:
                self._idle.notify_all()

    def run(self, key: str, inputs: dict[str, np.ndarray], fetch=None) -> dict[str, np.ndarray]:
        """Runs signature `key` through the subclass's `_call` (batched with concurrent calls when
        batching is on); `fetch`: the outputs wanted (None: all). Dtypes are checked first, as the
        Session checks feeds; shapes are left to the model (and to serving/request_limits.py)."""
        self.check_dtypes(key, inputs)
        batcher = self._batchers.get(key)
        outputs = batcher.submit(inputs) if batcher else self._call(key, inputs)
        if fetch is not None:
            outputs = {k: outputs[k] for k in fetch}
        return outputs

    def wait_idle(self, timeout: float) -> bool:
        with self._lock:
            self._idle_waiters += 1
            try:
                return self._idle.wait_for(lambda: self._in_flight == 0, timeout)
            finally:
                self._idle_waiters -= 1

    def check_dtypes(self, key: str, inputs: dict[str, np.ndarray]) -> None:
        """The one check before a run: each input's dtype, as DirectSession's call frame checks feeds
        (FunctionCallFrame::SetArgs: INVALID_ARGUMENT, its text; args numbered by feed name). The
        Session callable skips it, and a kernel given the wrong dtype aborts the process."""
        feeds = self._feeds.get(key)
        if feeds is None:
            feeds = {}
            signature = self.signature_defs[key]
            for index, (tensor, alias) in enumerate(sorted((info.name, alias) for alias, info in signature.inputs.items())):
                want = tf.dtypes.as_dtype(signature.inputs[alias].dtype)
                feeds[alias] = (index, dtype_name(want.as_datatype_enum),
                                None if want == tf.string else np.dtype(want.as_numpy_dtype))
            self._feeds[key] = feeds
        for alias, array in inputs.items():
            index, want_name, want = feeds[alias]
            is_string = array.dtype == object or array.dtype.kind in "SU"
            if (want is None) != is_string or (want is not None and array.dtype != want):
                got = "string" if is_string else dtype_name(tf.dtypes.as_dtype(array.dtype).as_datatype_enum)
                raise invalid(f"Expects arg[{index}] to be {want_name} but {got} is provided")

    def signature_shapes(self, name: str) -> dict[str, SpecShape]:
        """The TensorSpec shapes of signature `name`'s inputs (request_limits.signature_shapes), kept."""
        shapes = self._shapes.get(name)
        if shapes is None:
            shapes = self._shapes[name] = signature_shapes(self.signature_defs[name or names.DEFAULT])
        return shapes


class Servable(LoadedVersion):
    def __init__(self, name: str, version: int, path: str, batching: BatchingConfig | None, limits: RequestLimits,
                 intra_op_threads: int = 0, tags=SERVE_TAGS):
        self.name, self.version, self.path = name, version, path
        self.limits = limits  # what one request's tensors may be (serving/request_limits.py)
        check_version_dir(path)
        # Every SignatureDef, as GetModelMetadata lists them; the callable ones (not `__...`).
        self.all_signature_defs = read_signature_defs(path, tags)
        self.signature_defs = {k: v for k, v in self.all_signature_defs.items() if not k.startswith("__")}
        self._callers = SignatureCallers(path, self.signature_defs, intra_op_threads, tags)
        self._functions = self._callers.callers
        self.call_mode = self._callers.mode
        self.description = {}
        sig_file = names.signature_file(path)
        if tf.io.gfile.exists(sig_file):
            with tf.io.gfile.GFile(sig_file) as f:
                self.description = json.loads(f.read())
        self._init_shared(self._functions, batching)

    def unload(self) -> None:
        self._callers.close()  # also empties self._functions, the same dict

    def _call(self, key: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            return self._functions[key](inputs)
        except (tf.errors.OpError, ValueError, TypeError) as exc:
            raise graph_error(exc) from None
