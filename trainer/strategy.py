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


def tf_config_task() -> tuple[str, int, dict] | None:
    """(task type, index, cluster) from TF_CONFIG, as the Training Operator sets it; None when
    there is no cluster (a single process)."""
    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task, cluster = tf_config.get("task") or {}, tf_config.get("cluster") or {}
    if not task or sum(len(v) for v in cluster.values()) < 2:
        return None
    return task["type"], int(task.get("index", 0)), cluster


def chief_task(task_type: str, index: int, cluster: dict) -> bool:
    """The chief, else worker 0 when the cluster has no chief (MultiWorkerMirroredStrategy's rule)."""
    return task_type == "chief" or (task_type == "worker" and index == 0 and "chief" not in cluster)


def task_name(strategy: tf.distribute.Strategy) -> str:
    """`<type>-<index>` of this process in the cluster (stable across restarts, unlike a pid)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return "local"
    return f"{resolver.task_type}-{resolver.task_id}"


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """The worker that writes summaries and the real checkpoints."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    return chief_task(resolver.task_type, resolver.task_id, resolver.cluster_spec().as_dict())
