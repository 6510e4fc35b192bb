"""A model's predictions as data: each answer becomes an example of the label columns (the
predicted class of a classification head, the predicted value of a regression head), so the
statistics and drift code of validation/ compares what a model predicted on served traffic with
what it predicted on the eval split when it was pushed (recorded in its baseline)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import tensorflow as tf
from tensorflow.core.example import example_pb2

from serving import signature_names as names
from trainer.evaluation import (OpenSignature, as_probabilities, evaluation_signature, holds_probabilities,
                                read_description)
from trainer.heads import CLASSIFICATION, Head
from trainer.inputs import read_once, record_dataset

EVAL_PREDICTIONS = "eval_predictions"  # the baseline split holding them


def predicted_classes(scores: np.ndarray, logits: bool | None = None) -> np.ndarray:
    """Each row's class index from `[rows, classes]` scores, as the Evaluator reads them: one
    column (a binary classifier's, trainer.model_spec) is the probability of class 1, or its logit
    (`logits`: the Evaluator's reading of the model, RunningEvaluation.logits; None: read from
    these scores, trainer.evaluation.holds_probabilities)."""
    if scores.shape[1] == 1:
        logits = not holds_probabilities(scores) if logits is None else logits
        scores = as_probabilities(tf.constant(scores, tf.float32), logits).numpy()
    return np.argmax(scores, axis=1)


def predicted_examples(predicted: dict[str, np.ndarray], heads: list[Head]) -> list[example_pb2.Example]:
    """{head: scores [rows, classes] or values [rows, 1]} -> one example per row, keyed by label column."""
    rows = max((len(a) for a in predicted.values()), default=0)
    out = [example_pb2.Example() for _ in range(rows)]
    for head in heads:
        if head.name not in predicted:
            continue
        values = np.asarray(predicted[head.name]).reshape(len(predicted[head.name]), -1)
        classes = predicted_classes(values) if head.kind == CLASSIFICATION else None
        for i, example in enumerate(out[:len(values)]):
            feature = example.features.feature[head.label_column]
            if classes is not None:
                feature.bytes_list.value.append(head.vocabulary[int(classes[i])].encode())
            else:
                feature.float_list.value.append(float(values[i, 0]))
    return out


def predicted_columns(predicted: dict[str, np.ndarray], heads: list[Head],
                      logits: dict[str, bool] | None = None) -> pa.RecordBatch:
    """The same rows as `predicted_examples`, as tfx-bsl's decoder lays out their serialized form
    (one list column per label column, one value per row), built without a proto per row."""
    columns = {}
    for head in heads:
        if head.name not in predicted:
            continue
        values = np.asarray(predicted[head.name])
        rows = len(values)
        if head.kind == CLASSIFICATION:
            names = np.array([v.encode() for v in head.vocabulary], dtype=object)
            classes = predicted_classes(values.reshape(rows, -1), (logits or {}).get(head.name))
            flat = pa.array(names[classes], pa.large_binary())
        else:
            flat = pa.array(values.reshape(rows, -1)[:, 0].astype(np.float32), pa.float32())
        columns[head.label_column] = pa.LargeListArray.from_arrays(pa.array(np.arange(rows + 1), pa.int64()), flat)
    return pa.RecordBatch.from_pydict(dict(sorted(columns.items())))


def signature_columns(outputs: dict[str, np.ndarray], rows: int, heads: list[Head], keys: dict[str, str],
                      logits: dict[str, bool] | None = None) -> pa.RecordBatch:
    """predicted_columns of a tf.Example signature's answer for `rows` examples (`keys`: each
    head's output in it, trainer.evaluation.evaluation_signature; `logits`: the Evaluator's reading
    of a foreign classifier's scores, RunningEvaluation.logits)."""
    return predicted_columns({h.name: outputs[keys[h.name]].reshape(rows, -1) for h in heads}, heads, logits)


def eval_prediction_batches(saved_model_dir: str, eval_pattern: str, open_signature: OpenSignature,
                            batch_size: int = 4096):
    """The exported model's predictions on the eval split, as predicted_columns batches, streamed
    through its tf.Example signature (`predict`), the way the Evaluator calls it."""
    description = read_description(saved_model_dir)
    heads = [Head.from_json(h) for h in description["heads"]]
    signature, keys = evaluation_signature(description.get("layout", 1), heads)
    with open_signature(saved_model_dir, signature, outputs=sorted(set(keys.values()))) as call:
        for batch in read_once(record_dataset(eval_pattern).batch(batch_size).prefetch(1)).as_numpy_iterator():
            yield signature_columns(call({names.INPUTS: batch}), len(batch), heads, keys)
