"""Choosing the tf.distribute strategy (`trainer.strategy`)."""
from __future__ import annotations

import json
import os

import tensorflow as tf


def make_strategy(name: str) -> tf.distribute.Strategy:
    """auto: multi_worker when TF_CONFIG describes a cluster, mirrored on 2+ GPUs, else one device."""
    if name == "auto":
        cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {})
        if sum(len(v) for v in cluster.values()) > 1:
            name = "multi_worker"
        elif len(tf.config.list_logical_devices("GPU")) > 1:
            name = "mirrored"
        else:
            name = "one_device"
    if name == "multi_worker":
        if not os.environ.get("TF_CONFIG"):
            raise ValueError("trainer.strategy=multi_worker needs TF_CONFIG (cluster and task) in the environment")
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "mirrored":
        # Every GPU, or every logical CPU device when there is no GPU (tests use two).
        devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
        return tf.distribute.MirroredStrategy([d.name for d in devices])
    # One device: TensorFlow's default strategy, as fit() uses. OneDeviceStrategy places and
    # wraps every step and value, which cost ~30% of the step rate of a small model here.
    return tf.distribute.get_strategy()


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """The worker that writes summaries and the real checkpoints."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    return resolver.task_type == "chief" or (resolver.task_type == "worker" and resolver.task_id == 0 and
                                             "chief" not in resolver.cluster_spec().as_dict())
