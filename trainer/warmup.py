"""TF Serving's warmup file: `assets.extra/tf_serving_warmup_requests`, a TFRecord of
PredictionLog records that the server replays on load, so the first real request does not pay
for graph tracing."""
from __future__ import annotations

import os

import numpy as np
import tensorflow as tf
from tensorflow.core.example import example_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    input_pb2,
    model_pb2,
    predict_pb2,
    prediction_log_pb2,
    regression_pb2,
)

from serving import signature_names as names

WARMUP_FILE = names.WARMUP_FILE


def predict_log(signature: str, inputs: dict[str, np.ndarray]) -> prediction_log_pb2.PredictionLog:
    request = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(signature_name=signature))
    for name, values in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(values))
    return prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))


def examples_log(method: str, signature: str, serialized_examples: list[bytes]) -> prediction_log_pb2.PredictionLog:
    """A classify_log or regress_log (`method`: TF Serving's method name) on the examples."""
    examples = input_pb2.Input()
    examples.example_list.examples.extend(example_pb2.Example.FromString(e) for e in serialized_examples)
    spec = model_pb2.ModelSpec(signature_name=signature)
    if method == names.CLASSIFY_METHOD:
        request = classification_pb2.ClassificationRequest(model_spec=spec, input=examples)
        return prediction_log_pb2.PredictionLog(classify_log=prediction_log_pb2.ClassifyLog(request=request))
    request = regression_pb2.RegressionRequest(model_spec=spec, input=examples)
    return prediction_log_pb2.PredictionLog(regress_log=prediction_log_pb2.RegressLog(request=request))


def write_warmup(export_dir: str, serialized_examples: list[bytes], raw_features: dict[str, np.ndarray] | None = None,
                 default_method: str = names.CLASSIFY_METHOD) -> str:
    """A Classify or Regress request (`default_method`) on `serving_default`, a `predict`
    request on the serialized examples and, given the same rows as raw features, a
    `predict_raw` request. Returns the file's path."""
    if not serialized_examples:
        raise ValueError("warmup needs at least one example")
    logs = [examples_log(default_method, names.DEFAULT, serialized_examples),
            predict_log(names.PREDICT, {names.INPUTS: np.array(serialized_examples, dtype=object)})]
    if raw_features:
        logs.append(predict_log(names.PREDICT_RAW, raw_features))
    return write_logs(export_dir, logs)


def write_logs(export_dir: str, logs: list[prediction_log_pb2.PredictionLog]) -> str:
    """The warmup file holding `logs`; returns its path."""
    tf.io.gfile.makedirs(os.path.join(export_dir, names.ASSETS_EXTRA))
    path = names.warmup_file(export_dir)
    with tf.io.TFRecordWriter(path) as writer:
        for entry in logs:
            writer.write(entry.SerializeToString())
    return path


def read_warmup(export_dir: str) -> list[prediction_log_pb2.PredictionLog]:
    path = names.warmup_file(export_dir)
    return [prediction_log_pb2.PredictionLog.FromString(r) for r in tf.data.TFRecordDataset(path).as_numpy_iterator()]
