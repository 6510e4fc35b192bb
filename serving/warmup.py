"""Replaying a version's `assets.extra/tf_serving_warmup_requests` before it serves, as TF Serving
does (saved_model_warmup.cc, saved_model_warmup_util.cc): each PredictionLog runs through the
same API code as a client's request, with the same rules; the first failure fails the load.
At most 1000 records; streamed-predict and session-run logs are UNIMPLEMENTED there, so a file
holding one fails here too."""
from __future__ import annotations

import logging
import time

import grpc
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from serving import service
from serving import signature_names as names
from serving.errors import ServingError, invalid

log = logging.getLogger("loopline.serving")

_REPLAY = {
    "predict_log": service.predict_on,
    "classify_log": service.classify_on,
    "regress_log": service.regress_on,
    "multi_inference_log": service.multi_inference_on,
}


def warmup_path(version_dir: str) -> str:
    return names.warmup_file(version_dir)


def replay(servable, method_check: bool, iterations: int = 1) -> int:
    """Runs every warmup record on `servable` `iterations` times (TF Serving's
    --num_request_iterations_for_warmup); returns how many records (0: no file, which is fine).
    Raises ServingError naming the record that failed."""
    path = warmup_path(servable.path)
    if not tf.io.gfile.exists(path):
        return 0
    count = 0
    try:
        records = list(tf.data.TFRecordDataset(path).as_numpy_iterator())
    except tf.errors.OpError as exc:  # DATA_LOSS in TF Serving: not a TFRecord file
        raise ServingError(grpc.StatusCode.DATA_LOSS, f"{exc.message}. Please verify your warmup data is in TFRecord format.") from None
    for record in records:
        try:
            entry = prediction_log_pb2.PredictionLog.FromString(record)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError and friends
            raise invalid(f"Failed to parse warmup record: {record[:64]!r} from {path}") from None
        kind = entry.WhichOneof("log_type")
        if kind in ("predict_streamed_log", "session_run_log"):
            number = prediction_log_pb2.PredictionLog.DESCRIPTOR.fields_by_name[kind].number
            raise ServingError(grpc.StatusCode.UNIMPLEMENTED, f"Unsupported log_type for warmup: {number}")
        if kind is not None:
            try:
                for _ in range(iterations):
                    _REPLAY[kind](servable, getattr(entry, kind).request, method_check)
            except ServingError as exc:
                raise ServingError(exc.code, f"warmup record {count} ({kind}): {exc.message}") from None
        count += 1
        if count > names.WARMUP_MAX_RECORDS:
            raise invalid(f"Number of warmup records exceeds the maximum ({names.WARMUP_MAX_RECORDS}) at {path}")
    return count


def warm_up(servable, method_check: bool, metrics=None, iterations: int = 1) -> int:
    """replay(), logged with the count and time, and counted in `metrics` (serving.metrics)."""
    started = time.monotonic()
    try:
        count = replay(servable, method_check, iterations)
    except ServingError as exc:
        if metrics is not None:
            metrics.observe_warmup(servable.name, servable.version, 0, exc.code.name, time.monotonic() - started)
        raise
    seconds = time.monotonic() - started
    if metrics is not None:
        metrics.observe_warmup(servable.name, servable.version, count, "OK", seconds)
    log.info("model %s version %d: replayed %d warmup requests in %.2fs", servable.name, servable.version, count, seconds)
    return count
