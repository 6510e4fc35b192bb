"""Writes TF Serving's three config files into the serving root after a push:

- `models.config`: ModelServerConfig (name, base_path, platform, version policy, labels);
- `batching.config`: BatchingParameters (`--enable_batching --batching_parameters_file`);
- `monitoring.config`: MonitoringConfig with Prometheus on (`--monitoring_config_file`).

Every writer of models.config (this step, `loopline promote`, retention) reads, changes and
writes it (a temporary file renamed over it) under `models_config_lock`, so none undoes another's
change.

The pip package of the TF Serving API lacks the batching and monitoring protos, so their two
messages are declared here with TF Serving's field names and numbers; the files are real
textprotos that `tensorflow_model_server` reads.
"""
from __future__ import annotations

import contextlib
import os
import socket
import time

import portalocker
import tensorflow as tf
from google.protobuf import descriptor_pb2, descriptor_pool, text_format, wrappers_pb2
from google.protobuf import message_factory
from tensorflow_serving.config import model_server_config_pb2

from serving import create_only
from serving.config import ServingConfig
from serving.model_config import (
    ModelConfigError,
    model_config_path,
    read_model_server_config,
    resolved_path,
    safe_base_path,
    write_model_server_config,
    write_textproto,
)

MODELS_CONFIG_LOCK = ".models.config.lock"
LOCK_TIMEOUT_S = 60.0
# A lock marker on an object store older than this is taken over: its writer died (a writer holds
# it for one read and one write of a small file).
STALE_LOCK_S = 120.0
BATCHING_CONFIG_FILE = "batching.config"
MONITORING_CONFIG_FILE = "monitoring.config"
PROMETHEUS_PATH = "/monitoring/prometheus/metrics"


def _declare_messages():
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    f = descriptor_pb2.FileDescriptorProto(name="loopline_tf_serving_extra.proto", package="tensorflow.serving",
                                           dependency=["google/protobuf/wrappers.proto"], syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto
    batching = f.message_type.add(name="BatchingParameters")
    for number, (name, wrapper) in enumerate([
        ("max_batch_size", "Int64Value"), ("batch_timeout_micros", "Int64Value"),
        ("max_enqueued_batches", "Int64Value"), ("num_batch_threads", "Int64Value"),
        ("thread_pool_name", "StringValue"),
    ], start=1):
        batching.field.add(name=name, number=number, type=T.TYPE_MESSAGE, label=T.LABEL_OPTIONAL,
                           type_name=f".google.protobuf.{wrapper}")
    batching.field.add(name="allowed_batch_sizes", number=6, type=T.TYPE_INT64, label=T.LABEL_REPEATED)
    batching.field.add(name="pad_variable_length_inputs", number=7, type=T.TYPE_BOOL, label=T.LABEL_OPTIONAL)
    prometheus = f.message_type.add(name="PrometheusConfig")
    prometheus.field.add(name="enable", number=1, type=T.TYPE_BOOL, label=T.LABEL_OPTIONAL)
    prometheus.field.add(name="path", number=2, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    monitoring = f.message_type.add(name="MonitoringConfig")
    monitoring.field.add(name="prometheus_config", number=1, type=T.TYPE_MESSAGE, label=T.LABEL_OPTIONAL,
                         type_name=".tensorflow.serving.PrometheusConfig")
    pool.Add(f)
    get = lambda name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.serving.{name}"))
    return get("BatchingParameters"), get("MonitoringConfig")


BatchingParameters, MonitoringConfig = _declare_messages()


def model_entry(serving_root: str, name: str, num_versions: int = 1) -> model_server_config_pb2.ModelConfig:
    entry = model_server_config_pb2.ModelConfig(name=name, base_path=safe_base_path(serving_root, name),
                                                model_platform="tensorflow")
    entry.model_version_policy.latest.num_versions = num_versions
    return entry


def batching_parameters(config: ServingConfig):
    b = config.batching
    params = BatchingParameters()
    params.max_batch_size.value = b.max_batch_size
    params.batch_timeout_micros.value = b.batch_timeout_micros
    params.max_enqueued_batches.value = b.max_enqueued_batches
    params.num_batch_threads.value = b.num_batch_threads
    params.pad_variable_length_inputs = True
    return params


def monitoring_config():
    config = MonitoringConfig()
    config.prometheus_config.enable = True
    config.prometheus_config.path = PROMETHEUS_PATH
    return config


def read_textproto(path: str, message_class):
    message = message_class()
    with tf.io.gfile.GFile(path) as f:
        text_format.Parse(f.read(), message)
    return message


@contextlib.contextmanager
def models_config_lock(serving_root: str, timeout_s: float = LOCK_TIMEOUT_S):
    """Held while models.config is read, changed and written. A local serving root: an OS lock
    on `.models.config.lock` (released if its holder dies). An object store: a create-only marker
    of that name (serving.create_only), removed after, taken over when older than STALE_LOCK_S."""
    path = os.path.join(serving_root, MODELS_CONFIG_LOCK)
    if create_only.is_local(serving_root):
        tf.io.gfile.makedirs(serving_root)
        lock = portalocker.Lock(path, timeout=timeout_s)
        try:
            lock.acquire()
        except portalocker.exceptions.LockException:
            raise TimeoutError(f"{path}: another writer of models.config held it for over {timeout_s:g} s") from None
        try:
            yield
        finally:
            lock.release()
        return
    me = {"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}
    deadline = time.monotonic() + timeout_s
    while not create_only.create(path, me):
        holder = create_only.read(path)
        if holder is not None and time.time() - float(holder.get("time", 0)) > STALE_LOCK_S:
            create_only.delete(path)  # its writer died
            continue
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path}: held by {holder} for over {timeout_s:g} s")
        time.sleep(0.2)
    try:
        yield
    finally:
        create_only.delete(path)


def write_serving_configs(serving_root: str, config: ServingConfig) -> dict[str, str]:
    """Adds (or refreshes) `config.model_name` in models.config, keeping other models and the
    labels `loopline promote` set, and writes batching.config and monitoring.config. The root may
    be a local folder or a URI tf.io.gfile writes (gs://...). Returns {file name: path}."""
    with models_config_lock(serving_root):
        return _write_serving_configs(serving_root, config)


def _write_serving_configs(serving_root: str, config: ServingConfig) -> dict[str, str]:
    path = model_config_path(serving_root)
    server_config = model_server_config_pb2.ModelServerConfig()
    if tf.io.gfile.exists(path):
        server_config = read_model_server_config(path)
    entries = server_config.model_config_list.config
    existing = [m for m in entries if m.name == config.model_name]
    if existing:
        entry = existing[0]
        entry.base_path = safe_base_path(serving_root, config.model_name)
        if not entry.version_labels:
            entry.model_version_policy.Clear()
            entry.model_version_policy.latest.num_versions = config.num_versions
    else:
        entries.append(model_entry(serving_root, config.model_name, config.num_versions))
    for entry in entries:  # a hand-edited entry must not point outside the root either
        if resolved_path(entry.base_path) != safe_base_path(serving_root, entry.name):
            raise ModelConfigError(f"model {entry.name!r}: base_path {entry.base_path} is not <serving root>/{entry.name}")
    write_model_server_config(path, server_config)
    batching = os.path.join(serving_root, BATCHING_CONFIG_FILE)
    monitoring = os.path.join(serving_root, MONITORING_CONFIG_FILE)
    write_textproto(batching, batching_parameters(config))
    write_textproto(monitoring, monitoring_config())
    return {"models.config": path, BATCHING_CONFIG_FILE: batching, MONITORING_CONFIG_FILE: monitoring}
