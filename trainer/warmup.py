"""TF Serving's warmup file: `assets.extra/tf_serving_warmup_requests`, a TFRecord of
PredictionLog records that the server replays on load, so the first real request does not pay
for graph tracing."""
from __future__ import annotations

import os

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

WARMUP_FILE = "tf_serving_warmup_requests"


def predict_log(signature: str, inputs: dict[str, np.ndarray]) -> prediction_log_pb2.PredictionLog:
    request = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(signature_name=signature))
    for name, values in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(values))
    return prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))


def write_warmup(export_dir: str, serialized_examples: list[bytes], raw_features: dict[str, np.ndarray] | None = None) -> str:
    """One `serving_default` request on the serialized examples and, given the same rows as raw
    features, one `predict_raw` request. Returns the file's path."""
    if not serialized_examples:
        raise ValueError("warmup needs at least one example")
    folder = os.path.join(export_dir, "assets.extra")
    tf.io.gfile.makedirs(folder)
    path = os.path.join(folder, WARMUP_FILE)
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(predict_log("serving_default", {"inputs": np.array(serialized_examples, dtype=object)}).SerializeToString())
        if raw_features:
            writer.write(predict_log("predict_raw", raw_features).SerializeToString())
    return path


def read_warmup(export_dir: str) -> list[prediction_log_pb2.PredictionLog]:
    path = os.path.join(export_dir, "assets.extra", WARMUP_FILE)
    return [prediction_log_pb2.PredictionLog.FromString(r) for r in tf.data.TFRecordDataset(path).as_numpy_iterator()]
