"""Calling a loaded SavedModel signature with little Python around it.

`signature(**tensors)` binds the keyword arguments against the function type and casts every tensor
to its spec on each call: for a few inputs that costs more than a small model takes to run. The
server checks inputs against the SignatureDef before calling, so here the signature's flat function
is called directly, with eager tensors built straight from the NumPy arrays (what `tf.constant`
does after its own checks). Where this TensorFlow's internals are not as expected, the public call
is used instead.
"""
from __future__ import annotations

import logging

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import ops

log = logging.getLogger("loopline.serving")


class SignatureCaller:
    """`caller(inputs)`: {name: array} in, {output name: array} out, like the signature itself."""

    def __init__(self, function):
        self._function = function
        self._flat = None
        try:
            names = list(function.function_type.parameters)
            atomic = function._inference_function
            captures = list(function.captured_inputs)
            expected = len(atomic.cached_definition.signature.input_arg)
            if len(names) + len(captures) != expected:
                raise ValueError(f"{len(names)} inputs and {len(captures)} captures for {expected} arguments")
            self._context = context.context()
            self._context.ensure_initialized()
            self._flat = (names, atomic.call_flat, captures, atomic.function_type.pack_output)
        except (AttributeError, TypeError, ValueError) as exc:
            log.warning("signature calls take the slower public path: %s", exc)

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._flat is None:
            outputs = self._function(**{k: tf.constant(v) for k, v in inputs.items()})
        else:
            names, call_flat, captures, pack = self._flat
            device = self._context.device_name
            outputs = pack(call_flat(*[ops.EagerTensor(inputs[n], device, None) for n in names], *captures))
        return {k: v.numpy() for k, v in outputs.items()}
