"""Calling a SavedModel's signatures with little around them, as TF Serving does.

TF Serving loads a SavedModel's MetaGraph into a Session (restoring the variables, running its
init op) and serves each signature with Session runs on the signature's tensor names. The same is
done here with a Session callable per signature and TensorFlow's single-threaded executor: for a
small model, handing every call to the inter-op thread pool, or calling a tf.function eagerly
(binding, casting and nested function calls in Python), costs more than the model's ops.

Where a SavedModel cannot be run that way (v1 control flow: Switch/Merge, which that executor
refuses), the default executor is used; where it cannot be loaded into a Session at all,
the signatures are called eagerly through `tf.saved_model.load`. Either fallback is logged.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, saved_model_pb2
from tensorflow.python.util import deprecation

from serving.model_config import SAVED_MODEL_FILES, saved_model_file

log = logging.getLogger("loopline.serving")

Caller = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
SERVE_TAG = "serve"
SERVE_TAGS = (SERVE_TAG,)  # TF Serving's --saved_model_tags default
SINGLE_THREADED = "SINGLE_THREADED_EXECUTOR"
# v1 control flow, which the single-threaded executor refuses (TF2 models use If/While instead).
V1_CONTROL_FLOW = {"Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit", "RefExit",
                   "NextIteration", "RefNextIteration", "LoopCond"}


def read_signature_defs(path: str, tags=SERVE_TAGS) -> dict[str, meta_graph_pb2.SignatureDef]:
    """Every SignatureDef of the SavedModel's MetaGraph with exactly `tags` (as TensorFlow's
    loader picks it), from saved_model.pb or saved_model.pbtxt."""
    proto = saved_model_pb2.SavedModel()
    graph_file = saved_model_file(path)
    if graph_file is None:
        raise tf.errors.NotFoundError(None, None, f"no {' or '.join(SAVED_MODEL_FILES)} in {path}")
    with tf.io.gfile.GFile(graph_file, "rb") as f:
        data = f.read()
    if graph_file.endswith(".pbtxt"):
        text_format.Parse(data.decode("utf-8"), proto)
    else:
        proto.ParseFromString(data)
    for meta_graph in proto.meta_graphs:
        if set(meta_graph.meta_info_def.tags) == set(tags):
            return dict(meta_graph.signature_def.items())
    available = [sorted(m.meta_info_def.tags) for m in proto.meta_graphs]
    raise tf.errors.NotFoundError(None, None, f"MetaGraphDef associated with tags '{','.join(tags)}' could not be "
                                  f"found in SavedModel, with available tags '{available}'")


def _session_callers(path: str, signature_defs: dict[str, meta_graph_pb2.SignatureDef], executor: str,
                     intra_op_threads: int, tags) -> tuple[tf.compat.v1.Session, dict[str, Caller]]:
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1, intra_op_parallelism_threads=intra_op_threads,
                                      allow_soft_placement=True)
    config.experimental.executor_type = executor
    graph = tf.Graph()
    session = tf.compat.v1.Session(graph=graph, config=config)
    try:
        with graph.as_default(), deprecation.silence():  # TF Serving's loader; its v1 warning misleads here
            tf.compat.v1.saved_model.loader.load(session, list(tags), path)
        if executor == SINGLE_THREADED:
            graph_def = graph.as_graph_def()
            nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
            v1 = sorted({n.op for n in nodes} & V1_CONTROL_FLOW)
            if v1:
                raise ValueError(f"v1 control flow ops {v1}")
        callers = {}
        for key, sig in signature_defs.items():
            inputs, outputs = list(sig.inputs), list(sig.outputs)
            # A callable made from CallableOptions runs straight into the C API (TF_SessionRunCallable).
            # `Session.make_callable` with a feed list goes through `Session.run`, whose Python
            # (fetch mapping, feed conversion) costs ~120 us a call, several times the model's ops.
            # As TF Serving's Session::Run, it checks feed dtypes (InvalidArgument) but not shapes:
            # the model's own ops refuse what they cannot compute.
            run = session._make_callable_from_options(config_pb2.CallableOptions(  # noqa: SLF001 - see above
                feed=[sig.inputs[i].name for i in inputs], fetch=[sig.outputs[o].name for o in outputs]))

            def call(values, run=run, inputs=inputs, outputs=outputs):
                return dict(zip(outputs, run(*[values[i] for i in inputs])))

            callers[key] = call
        return session, callers
    except BaseException:
        session.close()
        raise


def _first_line(exc: BaseException) -> str:
    """The first line that says something (TensorFlow puts a "Graph execution error:" header first)."""
    lines = [line for line in str(exc).splitlines() if line.strip() and line.strip() != "Graph execution error:"]
    return lines[0] if lines else type(exc).__name__


def _eager_callers(path: str, signature_defs, tags) -> tuple[object, dict[str, Caller]]:
    loaded = tf.saved_model.load(path, tags=list(tags))

    def caller(function, outputs):
        return lambda values: {k: v.numpy() for k, v in function(**{n: tf.constant(a) for n, a in values.items()}).items()
                               if k in outputs}

    return loaded, {k: caller(loaded.signatures[k], set(signature_defs[k].outputs))
                    for k in signature_defs if k in loaded.signatures}


class SignatureCallers:
    """`callers[key](inputs)`: {input name: array} in, {output name: array} out, per signature."""

    def __init__(self, path: str, signature_defs: dict[str, meta_graph_pb2.SignatureDef], intra_op_threads: int = 0,
                 tags=SERVE_TAGS):
        self.mode = "session"
        self._session = self._loaded = None
        try:
            self._session, self.callers = _session_callers(path, signature_defs, SINGLE_THREADED, intra_op_threads, tags)
            return
        except Exception as exc:  # noqa: BLE001 - any failure (a private API gone included) falls back
            log.warning("%s: the single-threaded executor refused this model (%s); using the default executor", path,
                        _first_line(exc))
        try:
            self._session, self.callers = _session_callers(path, signature_defs, "", intra_op_threads, tags)
            self.mode = "session (default executor)"
        except Exception as exc:  # noqa: BLE001 - e.g. AttributeError when Session._make_callable_from_options is gone
            log.warning("%s: cannot be loaded into a Session (%s); calling its signatures eagerly", path,
                        _first_line(exc))
            self._loaded, self.callers = _eager_callers(path, signature_defs, tags)
            self.mode = "eager"

    def close(self) -> None:
        self.callers.clear()  # in place: holders of this dict see no signature after it
        self._loaded = None
        if self._session is not None:
            self._session.close()
            self._session = None


def answering_only(signature_def: meta_graph_pb2.SignatureDef, outputs: list[str]) -> meta_graph_pb2.SignatureDef:
    """The signature with only `outputs` in its answer (as TF Serving's Predict `output_filter`):
    a Session run fetches only those, so what only the others need is not computed."""
    unknown = sorted(set(outputs) - set(signature_def.outputs))
    if unknown:
        raise KeyError(f"the signature has no output {unknown} (it has {sorted(signature_def.outputs)})")
    trimmed = meta_graph_pb2.SignatureDef()
    trimmed.CopyFrom(signature_def)
    for key in list(trimmed.outputs):
        if key not in outputs:
            del trimmed.outputs[key]
    return trimmed


@contextmanager
def signature_caller(path: str, signature: str, intra_op_threads: int = 0,
                     outputs: list[str] | None = None) -> Iterator[Caller]:
    """One signature of a SavedModel, called as the server calls it (SignatureCallers, fallbacks
    included), for the time of a `with` block; the Evaluator's way to run a model on large batches.
    `outputs`: the outputs to answer with (None: all); e.g. a classifier's scores without the
    `[rows, classes]` class names beside them, which cost more than the model on large batches."""
    signature_defs = read_signature_defs(path)
    if signature not in signature_defs:
        raise KeyError(f"{path} has no signature '{signature}' (it has {sorted(signature_defs)})")
    signature_def = signature_defs[signature] if outputs is None else answering_only(signature_defs[signature], outputs)
    callers = SignatureCallers(path, {signature: signature_def}, intra_op_threads)
    try:
        yield callers.callers[signature]
    finally:
        callers.close()
