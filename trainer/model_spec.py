"""A SavedModel loopline did not export (a TFX run_fn's), described for the Evaluator as TFMA's
ModelSpec describes one: the signature called on serialized tf.Examples (`evaluator.signature_name`)
and the label its one output predicts (`evaluator.label_key`), read from the examples or, with
`evaluator.preprocessing_function_names`, from what those signatures of the model answer (TFX's
`transform_features`: a label the Transform made, such as `species_xf`). An output of k >= 2
columns is a classifier of the whole-number labels 0..k-1 (scores that are not probabilities are
read as logits); one column is a regression of the label, or, where the config names a binary
metric as TFMA's metrics_specs do (`binary`), the probability (or logit) of the label 1 (TFX's
taxi model: one sigmoid unit)."""
from __future__ import annotations

from typing import Callable

import tensorflow as tf

from trainer.evaluation import is_loopline_export, read_description
from trainer.evaluator_config import COMMON_PREDICTION_KEYS
from trainer.heads import CLASSIFICATION, REGRESSION, Head
from trainer.inputs import record_dataset

_LABEL_DTYPES = {"int64_list": "int64", "float_list": "float32", "bytes_list": "string"}


def describe_model(saved_model_dir: str, label_key: str, signature_name: str, eval_pattern: str,
                   preprocessing: list[str] = (), binary: bool = False, prediction_key: str = "") -> dict:
    """loopline's own description of its exports (read_description), else the ModelSpec's."""
    if is_loopline_export(saved_model_dir):
        return read_description(saved_model_dir)
    return model_spec_description(saved_model_dir, label_key, signature_name, eval_pattern, preprocessing, binary,
                                  prediction_key)


def model_spec_description(saved_model_dir: str, label_key: str, signature_name: str, eval_pattern: str,
                           preprocessing: list[str] = (), binary: bool = False, prediction_key: str = "") -> dict:
    """The description RunningEvaluation reads: one head named after `label_key`, and under
    `model_spec` the signature, its serialized-examples input, the head's output (`prediction_key`'s
    among several) and the `preprocessing` signatures the label is read from (none: from the examples)."""
    signatures = tf.saved_model.load(saved_model_dir).signatures
    function = _examples_signature(saved_model_dir, signatures, signature_name, "evaluator.signature_name")
    inputs = function.structured_input_signature[1]
    for name in preprocessing:
        _examples_signature(saved_model_dir, signatures, name, "evaluator.preprocessing_function_names")
    outputs = function.structured_outputs
    output = _prediction_output(outputs, prediction_key, f"{saved_model_dir}: signature {signature_name!r}", label_key)
    spec = outputs[output]
    width = spec.shape[-1] if spec.shape.rank == 2 else 1
    label_dtype = (_preprocessed_label_dtype(signatures, preprocessing, eval_pattern, label_key) if preprocessing
                   else _label_dtype(eval_pattern, label_key))
    if width >= 2 or binary:
        classes = max(width, 2)  # binary: one column, the probability of 1
        if label_dtype == "string":
            raise ValueError(f"evaluator.label_key '{label_key}' holds strings; a model that answers {width} "
                             f"score{'s' * (width > 1)} is read as a classifier of the whole numbers 0..{classes - 1}")
        head = Head(label_key, CLASSIFICATION, vocabulary=[str(i) for i in range(classes)], label_dtype=label_dtype)
    else:
        head = Head(label_key, REGRESSION, label_dtype=label_dtype)
    return {"features": {}, "heads": [head.to_json()],
            "model_spec": {"signature": signature_name, "input": next(iter(inputs)), "outputs": {label_key: output},
                           "preprocessing": list(preprocessing)}}


def _prediction_output(outputs: dict, prediction_key: str, where: str, label_key: str) -> str:
    """Which output predicts the label: `prediction_key`'s, the only one, or the first of TFMA's
    common prediction keys the signature answers."""
    if prediction_key:
        if prediction_key not in outputs:
            raise ValueError(f"{where}: evaluator.prediction_key '{prediction_key}' is not one of its outputs "
                             f"({_specs(outputs)})")
        return prediction_key
    if len(outputs) == 1:
        return next(iter(outputs))
    common = [key for key in COMMON_PREDICTION_KEYS if key in outputs]
    if not common:
        raise ValueError(f"{where} answers {_specs(outputs)}, none of them one of TFMA's prediction keys "
                         f"({', '.join(COMMON_PREDICTION_KEYS)}): set evaluator.prediction_key to the output that "
                         f"predicts evaluator.label_key '{label_key}'")
    return common[0]


def preprocessed_labels(saved_model_dir: str, description: dict) -> Callable[[tf.Tensor], dict] | None:
    """For a description whose label comes from preprocessing signatures: a function of a `[rows]`
    batch of serialized tf.Examples answering each head's label column `[rows, 1]` from those
    signatures' outputs (called in order, as TFMA does; a later one's output wins). None when the
    labels are read from the examples themselves."""
    names = (description.get("model_spec") or {}).get("preprocessing")
    if not names:
        return None
    loaded = tf.saved_model.load(saved_model_dir)
    columns = [Head.from_json(h).label_column for h in description["heads"]]

    def labels(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        outputs = _preprocessed(loaded.signatures, names, serialized)
        # As parse_examples answers a label column: numbers as float32 (Head.encode_label's input).
        return {column: tf.reshape(outputs[column] if outputs[column].dtype == tf.string
                                   else tf.cast(outputs[column], tf.float32), [-1, 1]) for column in columns}

    return labels


def _preprocessed(signatures, names: list[str], serialized: tf.Tensor) -> dict[str, tf.Tensor]:
    outputs = {}
    for name in names:
        function = signatures[name]
        outputs.update(function(**{next(iter(function.structured_input_signature[1])): serialized}))
    return outputs


def _examples_signature(saved_model_dir: str, signatures, name: str, key: str):
    """The signature `name`, which must take one input of serialized tf.Examples (`key` names the setting)."""
    if name not in signatures:
        raise ValueError(f"{saved_model_dir} has no signature {name!r} ({key}; it has {sorted(signatures)})")
    inputs = signatures[name].structured_input_signature[1]
    if len(inputs) != 1 or next(iter(inputs.values())).dtype != tf.string:
        raise ValueError(f"{saved_model_dir}: signature {name!r} must take one input of serialized "
                         f"tf.Examples (it takes {_specs(inputs)})")
    return signatures[name]


def _preprocessed_label_dtype(signatures, names: list[str], eval_pattern: str, label_key: str) -> str:
    """The label's kind as the preprocessing signatures answer it on the first eval examples."""
    records = tf.stack(list(record_dataset(eval_pattern).take(10)))
    outputs = _preprocessed(signatures, names, records)
    if label_key not in outputs:
        raise ValueError(f"evaluator.label_key '{label_key}' is not among the outputs of "
                         f"evaluator.preprocessing_function_names {list(names)} ({sorted(outputs)})")
    dtype = outputs[label_key].dtype
    return "string" if dtype == tf.string else "int64" if dtype.is_integer else "float32"


def _specs(specs: dict) -> str:
    return ", ".join(f"{name} {spec.dtype.name}{spec.shape}" for name, spec in specs.items()) or "nothing"


def _label_dtype(eval_pattern: str, label_key: str) -> str:
    """How the label is stored in the first eval example that holds it."""
    for record in record_dataset(eval_pattern).take(100):
        feature = tf.train.Example.FromString(record.numpy()).features.feature.get(label_key)
        if feature is not None and feature.WhichOneof("kind"):
            return _LABEL_DTYPES[feature.WhichOneof("kind")]
    raise ValueError(f"evaluator.label_key '{label_key}' is in none of the first eval examples of {eval_pattern}")
