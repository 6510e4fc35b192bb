"""Evaluating an exported SavedModel on the eval split: reading what the export recorded beside it,
and computing the trainer's metrics from its signatures' answers (the blessing: trainer.blessing)."""
from __future__ import annotations

import json

import numpy as np
import tensorflow as tf

from serving import signature_names as names
from trainer.features import parse_examples
from trainer.heads import CLASSIFICATION, Head, HeadTotals
from trainer.inputs import record_dataset


def read_description(saved_model_dir: str) -> dict:
    """What trainer.export recorded beside the SavedModel (features, heads, signature layout)."""
    path = names.signature_file(saved_model_dir)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"{saved_model_dir} is not a loopline export: {path} is missing")
    with tf.io.gfile.GFile(path) as f:
        return json.loads(f.read())


def read_signature(saved_model_dir: str) -> tuple[dict[str, str], list[Head]]:
    """The feature kinds and heads recorded at export time."""
    data = read_description(saved_model_dir)
    return data["features"], [Head.from_json(h) for h in data["heads"]]


def prediction_key(heads: list[Head], head: Head) -> str:
    """The `predict_raw` output holding a head's prediction (trainer.export.named_outputs names
    them so), also the layout-1 `serving_default`'s."""
    first = head is heads[0]
    if head.kind == CLASSIFICATION:
        return names.SCORES if first else f"{head.name}_{names.SCORES}"
    return names.OUTPUTS if first else head.name


def evaluation_signature(layout: int, heads: list[Head]) -> tuple[str, dict[str, str]]:
    """The tf.Example signature answering for every head, and each head's output in it: `predict`
    (`<head>_scores`, `<head>_outputs`), or in exports before it (layout 1) `serving_default`."""
    if layout >= 2:
        return names.PREDICT, {h.name: names.head_output(h.name, names.SCORES if h.kind == CLASSIFICATION else names.OUTPUTS)
                               for h in heads}
    return names.DEFAULT, {h.name: prediction_key(heads, h) for h in heads}


def label_kinds(heads: list[Head]) -> dict[str, str]:
    """The label columns to parse (parse_examples keys them by head name)."""
    return {h.label_column: h.label_dtype for h in heads}


def head_metrics(heads: list[Head], predictions: dict[str, np.ndarray], labels: dict[str, np.ndarray]) -> dict[str, float]:
    """The trainer's evaluation metrics (HeadTotals) of predictions by head name against the raw
    label columns (`[rows, 1]`, as parse_examples gives them)."""
    totals = HeadTotals(heads)
    totals.add({h.name: h.encode_label(tf.constant(labels[h.name])) for h in heads},
               {h.name: tf.constant(predictions[h.name], tf.float32) for h in heads})
    return totals.metrics()


def read_examples(file_pattern: str, limit: int | None = None) -> list[bytes]:
    """Serialized tf.Examples of a split (GZIP TFRecords), in file order."""
    dataset = record_dataset(file_pattern)
    if limit:
        dataset = dataset.take(limit)
    return list(dataset.as_numpy_iterator())


def evaluate_saved_model(saved_model_dir: str, examples: list[bytes], batch_size: int = 256,
                         heads: list[Head] | None = None) -> dict[str, float]:
    """Metrics of an exported model, computed from its `predict` answers (`serving_default`'s
    for exports before it) on serialized eval examples (`read_examples`). `heads`: its
    read_signature heads, when already read."""
    description = read_description(saved_model_dir)
    heads = heads if heads is not None else [Head.from_json(h) for h in description["heads"]]
    signature, keys = evaluation_signature(description.get("layout", 1), heads)
    serve = tf.saved_model.load(saved_model_dir).signatures[signature]
    predictions: dict[str, list] = {h.name: [] for h in heads}
    labels: dict[str, list] = {h.name: [] for h in heads}
    for start in range(0, len(examples), batch_size):
        chunk = tf.constant(examples[start:start + batch_size])
        out = serve(inputs=chunk)
        parsed = parse_examples(chunk, label_kinds(heads))
        for head in heads:
            predictions[head.name].append(out[keys[head.name]].numpy())
            labels[head.name].append(parsed[head.name].numpy())
    return head_metrics(
        heads,
        {k: np.concatenate(v) for k, v in predictions.items()},
        {k: np.concatenate(v) for k, v in labels.items()},
    )


def is_loopline_export(saved_model_dir: str) -> bool:
    return tf.io.gfile.exists(names.signature_file(saved_model_dir))
