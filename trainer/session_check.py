"""Whether a SavedModel's signature runs in a TensorFlow 1 Session, as TF Serving and `loopline
serve` call a model. A Keras 3 model saved with `tf.saved_model.save` (a TFX run_fn's, e.g. TFX's
penguin example) loads there, but its variables are not restored under the names its functions
read, so every call fails; an empty batch shows it without any data."""
from __future__ import annotations

import tensorflow as tf


def session_problem(saved_model_dir: str, signature: str = "serving_default") -> str | None:
    """The error's first line when `signature` cannot run in a Session on an empty batch; None when it runs."""
    graph = tf.Graph()
    try:
        with tf.compat.v1.Session(graph=graph) as session:
            meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], saved_model_dir)
            signature_def = meta_graph.signature_def[signature]
            feeds = {}
            for spec in signature_def.inputs.values():
                tensor = graph.get_tensor_by_name(spec.name)
                shape = [0 if d is None else d for d in (tensor.shape.as_list() if tensor.shape.rank is not None else [0])]
                feeds[tensor] = tf.zeros(shape, tensor.dtype).numpy() if tensor.dtype != tf.string else [b""] * shape[0]
            session.run([graph.get_tensor_by_name(spec.name) for spec in signature_def.outputs.values()], feeds)
    except Exception as exc:  # noqa: BLE001 - the answer is the problem itself
        message = getattr(exc, "message", None) or str(exc)
        words = [line.strip() for line in message.splitlines()
                 if line.strip() and not line.startswith(("Graph execution error", "\t [["))]
        return words[0] if words else type(exc).__name__
    return None
