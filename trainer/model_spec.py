"""A SavedModel loopline did not export (a TFX run_fn's), described for the Evaluator as TFMA's
ModelSpec describes one: the signature called on serialized tf.Examples (`evaluator.signature_name`)
and the label its one output predicts (`evaluator.label_key`). An output of k >= 2 columns is a
classifier of the whole-number labels 0..k-1 (scores that are not probabilities are read as
logits); one column is a regression of the label."""
from __future__ import annotations

import tensorflow as tf

from trainer.evaluation import is_loopline_export, read_description
from trainer.heads import CLASSIFICATION, REGRESSION, Head
from trainer.inputs import record_dataset

_LABEL_DTYPES = {"int64_list": "int64", "float_list": "float32", "bytes_list": "string"}


def describe_model(saved_model_dir: str, label_key: str, signature_name: str, eval_pattern: str) -> dict:
    """loopline's own description of its exports (read_description), else the ModelSpec's."""
    if is_loopline_export(saved_model_dir):
        return read_description(saved_model_dir)
    return model_spec_description(saved_model_dir, label_key, signature_name, eval_pattern)


def model_spec_description(saved_model_dir: str, label_key: str, signature_name: str, eval_pattern: str) -> dict:
    """The description RunningEvaluation reads: one head named after `label_key`, and under
    `model_spec` the signature, its serialized-examples input and the head's output."""
    signatures = tf.saved_model.load(saved_model_dir).signatures
    if signature_name not in signatures:
        raise ValueError(f"{saved_model_dir} has no signature {signature_name!r} (evaluator.signature_name; it has "
                         f"{sorted(signatures)})")
    function = signatures[signature_name]
    inputs = function.structured_input_signature[1]
    if len(inputs) != 1 or next(iter(inputs.values())).dtype != tf.string:
        raise ValueError(f"{saved_model_dir}: signature {signature_name!r} must take one input of serialized "
                         f"tf.Examples (it takes {_specs(inputs)})")
    outputs = function.structured_outputs
    if len(outputs) != 1:
        raise ValueError(f"{saved_model_dir}: signature {signature_name!r} must answer one output for "
                         f"evaluator.label_key '{label_key}' (it answers {_specs(outputs)})")
    output, spec = next(iter(outputs.items()))
    width = spec.shape[-1] if spec.shape.rank == 2 else 1
    label_dtype = _label_dtype(eval_pattern, label_key)
    if width >= 2:
        if label_dtype == "string":
            raise ValueError(f"evaluator.label_key '{label_key}' holds strings; a model that answers {width} scores "
                             f"is read as a classifier of the whole numbers 0..{width - 1}")
        head = Head(label_key, CLASSIFICATION, vocabulary=[str(i) for i in range(width)], label_dtype=label_dtype)
    else:
        head = Head(label_key, REGRESSION, label_dtype=label_dtype)
    return {"features": {}, "heads": [head.to_json()],
            "model_spec": {"signature": signature_name, "input": next(iter(inputs)), "outputs": {label_key: output}}}


def _specs(specs: dict) -> str:
    return ", ".join(f"{name} {spec.dtype.name}{spec.shape}" for name, spec in specs.items()) or "nothing"


def _label_dtype(eval_pattern: str, label_key: str) -> str:
    """How the label is stored in the first eval example that holds it."""
    for record in record_dataset(eval_pattern).take(100):
        feature = tf.train.Example.FromString(record.numpy()).features.feature.get(label_key)
        if feature is not None and feature.WhichOneof("kind"):
            return _LABEL_DTYPES[feature.WhichOneof("kind")]
    raise ValueError(f"evaluator.label_key '{label_key}' is in none of the first eval examples of {eval_pattern}")
