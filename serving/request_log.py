"""Request logging in the server, in TF Serving's shape (core/server_request_logger.cc,
core/request_logger.cc, core/log_collector.h), which its open-source build never wires up:

- per model, a sampling rate: a hand-written `logging_config` in the model's models.config entry,
  else `serving.request_log.sampling_rate` from the loopline-only `request_log.json` beside
  models.config; sampling is decided per request (RequestLogger::Log's uniform sampler);
- a sampled request and its answer become a `PredictionLog` (predict_log, classify_log,
  regress_log or multi_inference_log) with LogMetadata: the model spec of the version that
  answered, the sampling config, the SavedModel tags and the time;
- the request path only samples and appends the pair to a bounded queue (a deque: no lock, no
  wake-up); a full queue drops the record and counts it. A writer thread takes what is queued
  every WRITE_EVERY_S, builds, strips (`exclude_features`), serializes and writes it into GZIP
  TFRecord files cut by size and time (serving.request_log_files), and deletes files older than
  `keep_days`. Waking it per request would cost the request path a thread switch each (the
  server answers on one core's worth of Python), several times the record's own cost.

Only answered requests reach `log()`: a failed request is counted by the request metrics and a
warmup replay by the warmup metrics, and neither is logged. A log that cannot be written is
counted and never fails or delays a request.
"""
from __future__ import annotations

import collections
import logging
import random
import threading
import time

import grpc
import tensorflow as tf
from tensorflow.core.example import example_pb2
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import (classification_pb2, inference_pb2, logging_pb2, predict_pb2, prediction_log_pb2,
                                     regression_pb2)
from tensorflow_serving.config import logging_config_pb2

from serving import request_ids, rules
from serving import signature_names as names
from serving.errors import ServingError, invalid
from serving.request_log_config import RequestLogConfig, default_log_dir, read_request_log_file, request_log_file
from serving.request_log_files import DEFAULT_PREFIX, LogFile, delete_older_than, version_dir
from serving.signature_call import SERVE_TAGS
from serving.tensors import from_numpy

log = logging.getLogger("loopline.serving")

# LogCollectorConfig.type values loopline honours ("" when none is named): it has one collector,
# GZIP TFRecord files. TF Serving registers collectors by type and refuses an unknown one.
COLLECTOR_TYPES = ("", "loopline")
_KIND = {predict_pb2.PredictRequest: "predict_log", classification_pb2.ClassificationRequest: "classify_log",
         regression_pb2.RegressionRequest: "regress_log", inference_pb2.MultiInferenceRequest: "multi_inference_log"}
RETENTION_EVERY_S = 3600.0
WRITE_EVERY_S = 0.05


def checked_logging_configs(entries: dict) -> dict[str, logging_config_pb2.LoggingConfig]:
    """The `logging_config` of each models.config entry that has one, checked: a collector type
    loopline does not have is TF Serving's NOT_FOUND; what loopline cannot honour is refused."""
    configs = {}
    for name, entry in entries.items():
        if not entry.HasField("logging_config"):
            continue
        config = entry.logging_config
        kind = config.log_collector_config.type
        if kind not in COLLECTOR_TYPES:
            raise ServingError(grpc.StatusCode.NOT_FOUND,
                               f"Cannot find LogCollector::Factory for type: {kind} (model {name}: loopline writes "
                               "GZIP TFRecord files; leave log_collector_config.type empty or set it to 'loopline')")
        rate = config.sampling_config.sampling_rate
        if not 0.0 <= rate <= 1.0:
            raise invalid(f"model {name}: logging_config.sampling_config.sampling_rate {rate:g} is outside [0, 1]")
        if config.HasField("custom_logging_config"):
            raise invalid(f"model {name}: logging_config.custom_logging_config is not supported by loopline")
        prefix = config.log_collector_config.filename_prefix
        if prefix and (prefix.startswith(".") or not all(c.isalnum() or c in "_.-" for c in prefix)):
            raise invalid(f"model {name}: logging_config.log_collector_config.filename_prefix {prefix!r} "
                          "is not a plain file name")
        configs[name] = config
    return configs


def holds_examples(name: str, tensor) -> bool:
    """Whether a Predict input holds serialized tf.Examples: the export contract's `inputs`
    string tensor (the `predict` and tf.Example signatures), not one feature's values."""
    return name == names.INPUTS and tensor.dtype == types_pb2.DT_STRING


def strip_features(entry: prediction_log_pb2.PredictionLog, columns: list[str]) -> None:
    """Removes `columns` (by data column name or signature name) from a logged request: raw
    Predict inputs, features of serialized or listed tf.Examples, and their context."""
    drop = {*columns, *(names.signature_name(c) for c in columns)}
    kind = entry.WhichOneof("log_type")
    request = getattr(entry, kind).request
    if kind == "predict_log":
        for key in list(request.inputs):
            tensor = request.inputs[key]
            if key in drop:
                del request.inputs[key]
            elif holds_examples(key, tensor):
                try:
                    stripped = [_without(example_pb2.Example.FromString(v), drop).SerializeToString() for v in tensor.string_val]
                except Exception:  # noqa: BLE001 - not tf.Examples: nothing says the excluded data is not in it
                    del request.inputs[key]
                    continue
                del tensor.string_val[:]
                tensor.string_val.extend(stripped)
        return
    which = request.input.WhichOneof("kind")
    if which is not None:
        listed = getattr(request.input, which)
        for example in listed.examples:
            _without(example, drop)
        if which == "example_list_with_context":
            _without(listed.context, drop)


def _without(example: example_pb2.Example, drop: set[str]) -> example_pb2.Example:
    for key in drop & set(example.features.feature):
        del example.features.feature[key]
    return example


class RequestLogOff:
    """No logging (a manager used without a server): only the models.config check."""

    def log(self, request, response) -> None:
        pass

    def log_predict(self, spec, version: int, inputs, outputs) -> None:
        pass

    def configure_models(self, entries: dict) -> None:
        checked_logging_configs(entries)


OFF = RequestLogOff()


class RequestLog:
    """The server's request logger: sampling on the request path, everything else in a writer thread."""

    def __init__(self, config_dir: str | None, metrics=None, poll_seconds: float = 2.0, tags=SERVE_TAGS):
        """`config_dir`: the folder of models.config, where request_log.json is read (None: a server
        without a config file, e.g. TF Serving's --model_base_path: no settings file, nothing logged);
        `tags`: the SavedModel tags the server loads, recorded in each record."""
        self.config_dir = config_dir
        self.settings_path = request_log_file(config_dir) if config_dir else None
        self.settings = RequestLogConfig()
        self.log_dir = default_log_dir(config_dir) if config_dir else None
        self.metrics, self.poll_seconds, self.tags = metrics, poll_seconds, tuple(tags)
        self._model_configs: dict[str, logging_config_pb2.LoggingConfig] = {}
        # Read on the request path without a lock: each is replaced whole, never changed in place.
        self._rates: dict[str, float] = {}
        self._default_rate = 0.0
        self._settings_text: str | None = None
        self._queue: collections.deque = collections.deque()  # bounded by settings.queue_size in _sample
        self._files: dict[tuple[str, int], LogFile] = {}  # the writer thread's alone
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_retention = 0.0
        self._write_errors = 0

    # -- the request path -------------------------------------------------------------------------
    def log(self, request, response) -> None:
        """An answered Predict, Classify, Regress or MultiInference request (the protos)."""
        spec = request.tasks[0].model_spec if isinstance(request, inference_pb2.MultiInferenceRequest) else request.model_spec
        self._sample(spec.name, (request, response))

    def log_predict(self, spec, version: int, inputs: dict, outputs: dict) -> None:
        """An answered REST predict: the arrays its JSON became, logged as the PredictRequest they make."""
        self._sample(spec.name, (spec, version, inputs, outputs))

    def _sample(self, model: str, payload: tuple) -> None:
        rate = self._rates.get(model, self._default_rate)
        if rate <= 0.0 or (rate < 1.0 and random.random() >= rate):
            return
        if len(self._queue) >= self.settings.queue_size:
            self._count(model, "queue_full")
            return
        self._queue.append((payload, request_ids.CURRENT.get(), time.time(), rate))

    def _count(self, model: str, outcome: str, count: int = 1) -> None:
        if self.metrics is not None:
            self.metrics.observe_request_log(model, outcome, count)

    # -- configuration ----------------------------------------------------------------------------
    def configure_models(self, entries: dict) -> None:
        """models.config's per-model `logging_config` (checked before the manager applies anything)."""
        self._model_configs = checked_logging_configs(entries)
        self._update_rates()

    def _update_rates(self) -> None:
        self._rates = {name: c.sampling_config.sampling_rate for name, c in self._model_configs.items()}
        self._default_rate = self.settings.sampling_rate

    def reload_settings(self) -> None:
        """Reads request_log.json when it changed (no file: logging off unless models.config says
        otherwise); a file that is not valid keeps the settings in use, saying why."""
        if self.settings_path is None:
            return
        try:
            with tf.io.gfile.GFile(self.settings_path) as f:
                text = f.read()
        except tf.errors.NotFoundError:
            text = ""
        if text == self._settings_text:
            return
        self._settings_text = text
        try:
            settings, log_dir = read_request_log_file(self.settings_path) if text else \
                (RequestLogConfig(), default_log_dir(self.config_dir))
        except (ValueError, tf.errors.OpError) as exc:
            log.error("request log settings not applied, the previous ones stay: %s", exc)
            return
        if log_dir != self.log_dir:
            self._close_all()
        self.settings, self.log_dir = settings, log_dir
        self._update_rates()
        log.info("request log: sampling %s into %s", self._describe_rates(), log_dir)

    def _describe_rates(self) -> str:
        own = ", ".join(f"{name} {rate:g}" for name, rate in sorted(self._rates.items()))
        return f"{self._default_rate:g}" + (f" ({own} from models.config)" if own else "")

    # -- the writer thread ------------------------------------------------------------------------
    def start(self) -> "RequestLog":
        self.reload_settings()
        self._thread = threading.Thread(target=self._run, name="request-log", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Writes what is queued, then closes (publishes) every open file."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        next_poll = time.monotonic() + self.poll_seconds
        while True:
            stopping = self._stopping.wait(WRITE_EVERY_S)
            try:
                written: collections.Counter = collections.Counter()
                while self._queue:  # everything queued, then the files' and the settings' turn
                    written[self._write(self._queue.popleft())] += 1
                for model, count in written.items():
                    if model is not None:  # counted once per batch: the counters take a lock
                        self._count(model, "written", count)
                now = time.time()
                self._close_due(now)
                self._retention(now)
                if self.poll_seconds > 0 and time.monotonic() >= next_poll:  # <= 0: read once, as the config file
                    next_poll = time.monotonic() + self.poll_seconds
                    self.reload_settings()
            except Exception:  # noqa: BLE001 - the writer must outlive anything
                log.exception("request log writer")
            if stopping:
                break
        self._close_all()

    def _write(self, item) -> str | None:
        """Writes one queued record; returns its model, None when it could not be written (counted)."""
        payload, request_id, at, rate = item
        model = ""
        try:
            if self.log_dir is None:
                raise ValueError("no folder for request logs: the server has no models.config file beside which "
                                 "request_log.json would name one")
            if self.settings.exclude_features:
                model, version, entry = prediction_log(payload, rate, at, self.tags)
                strip_features(entry, self.settings.exclude_features)
                record = entry.SerializeToString()
            else:
                model, version, record = serialized_log(payload, rate, at, self.tags)
            key = (model, version)
            if key not in self._files:
                self._files[key] = LogFile(version_dir(self.log_dir, model, version), self._prefix(model))
            self._files[key].write(record, request_id, at)
            if self._files[key].bytes >= self.settings.max_file_mb * 1e6:
                self._close(key)
            return model
        except Exception as exc:  # noqa: BLE001 - a bucket that is down must not stop the server
            self._count(model, "write_error")
            self._write_errors += 1
            if self._write_errors in (1, 10, 100) or self._write_errors % 1000 == 0:
                log.warning("request log: %d records not written so far; the last because %s: %s", self._write_errors,
                            type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            return None

    def _prefix(self, model: str) -> str:
        config = self._model_configs.get(model)
        return (config.log_collector_config.filename_prefix if config is not None else "") or DEFAULT_PREFIX

    def _close_due(self, now: float) -> None:
        for key, file in list(self._files.items()):
            if now - file.opened >= self.settings.max_file_seconds:
                self._close(key)

    def _close(self, key) -> None:
        file = self._files.pop(key)
        try:
            path = file.close()
        except Exception as exc:  # noqa: BLE001 - counted; the next record opens a new file
            log.warning("request log: %s could not be closed (%d records lost): %s: %s", file.staged, file.records,
                        type(exc).__name__, exc)
            if self.metrics is not None:
                self.metrics.observe_request_log(key[0], "write_error", file.records)
            return
        if path:
            log.info("request log: %s (%d records)", path, file.records)

    def _close_all(self) -> None:
        for key in list(self._files):
            self._close(key)

    def _retention(self, now: float) -> None:
        if self.log_dir is None or self.settings.keep_days is None or now < self._next_retention:
            return  # no folder: a server without a config file logs nothing
        self._next_retention = now + RETENTION_EVERY_S
        open_files = frozenset(f.staged for f in self._files.values())
        removed = delete_older_than(self.log_dir, now - self.settings.keep_days * 86400, open_files)
        if removed:
            log.info("request log: %d files older than %g days removed", removed, self.settings.keep_days)


def _pair(payload: tuple) -> tuple[str, object, object, object]:
    """(log type, request, response, the model spec that answered) of a queued payload; a REST
    predict's arrays become the PredictRequest and PredictResponse its JSON stands for."""
    if len(payload) == 2:
        request, response = payload
        kind = _KIND[type(request)]
        return kind, request, response, response.results[0].model_spec if kind == "multi_inference_log" else response.model_spec
    spec, version, inputs, outputs = payload
    request, response = predict_pb2.PredictRequest(model_spec=spec), predict_pb2.PredictResponse()
    for name, array in inputs.items():
        from_numpy(array, request.inputs[name], as_fields=True)
    answered = response.model_spec
    answered.name, answered.signature_name, answered.version.value = spec.name, rules.signature_key(spec.signature_name), version
    for name, array in outputs.items():
        from_numpy(array, response.outputs[name], as_fields=True)
    return "predict_log", request, response, answered


def _metadata(answered, rate: float, at: float, tags) -> logging_pb2.LogMetadata:
    metadata = logging_pb2.LogMetadata(saved_model_tags=list(tags), timestamp_secs=int(at))
    metadata.model_spec.CopyFrom(answered)
    metadata.sampling_config.sampling_rate = rate
    return metadata


def prediction_log(payload: tuple, rate: float, at: float,
                   tags=SERVE_TAGS) -> tuple[str, int, prediction_log_pb2.PredictionLog]:
    """(model, version that answered, the PredictionLog) of a queued request and its answer."""
    kind, request, response, answered = _pair(payload)
    entry = prediction_log_pb2.PredictionLog(log_metadata=_metadata(answered, rate, at, tags))
    logged = getattr(entry, kind)
    logged.request.CopyFrom(request)
    logged.response.CopyFrom(response)
    return answered.name, answered.version.value, entry


_FIELD_NUMBER = {f.name: f.number for f in prediction_log_pb2.PredictionLog.DESCRIPTOR.fields}
_TIMESTAMP_TAG = bytes([logging_pb2.LogMetadata.DESCRIPTOR.fields_by_name["timestamp_secs"].number << 3])  # a varint


def _varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


_METADATA_BEFORE_TIME: dict[tuple, bytes] = {}  # the writer thread's; a few entries per version served


def serialized_log(payload: tuple, rate: float, at: float, tags=SERVE_TAGS) -> tuple[str, int, bytes]:
    """prediction_log's record as bytes, without copying the request and answer into a new
    message: the same bytes protobuf writes (fields in number order, each message
    length-delimited; LogMetadata's fields before the time are the same for every answer of a
    version and signature, so they are serialized once)."""
    kind, request, response, answered = _pair(payload)
    key = (answered.name, answered.version.value, answered.signature_name, rate, tags)
    static = _METADATA_BEFORE_TIME.get(key)
    if static is None:
        metadata = _metadata(answered, rate, 0.0, tags)
        metadata.ClearField("timestamp_secs")
        static = _METADATA_BEFORE_TIME[key] = metadata.SerializeToString()
    metadata = static + _TIMESTAMP_TAG + _varint(int(at))
    body = _field(1, request.SerializeToString()) + _field(2, response.SerializeToString())
    return answered.name, answered.version.value, _field(1, metadata) + _field(_FIELD_NUMBER[kind], body)
