"""What a run reports as it goes: TensorBoard (train, validation and eval writers), metric sinks
(e.g. MLflow) and a progress bar on a terminal or plain log lines otherwise."""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Protocol, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2, types_pb2

log = logging.getLogger("loopline.trainer")
# Progress lines when no bar is drawn: the command line shows this logger's records on the terminal.
progress_log = logging.getLogger("loopline.trainer.progress")


def _metadata(plugin: str) -> summary_pb2.SummaryMetadata:
    # tf.summary.write with the plugin's metadata writes the records tf.summary.scalar/histogram
    # (from the tensorboard package) write, without needing that package to train; a test reads
    # them back with TensorBoard's own event reader.
    meta = summary_pb2.SummaryMetadata()
    meta.plugin_data.plugin_name = plugin
    meta.plugin_data.content = b""
    return meta


_SCALAR, _HISTOGRAM, _IMAGE = _metadata("scalars"), _metadata("histograms"), _metadata("images")


def scalars_summary(values: dict[str, float]) -> bytes:
    """One Summary holding every scalar, each value as tf.summary.scalar writes it (a float32
    tensor with the scalars plugin's metadata): one record and one op per call, not one per scalar
    (each eager summary op costs about half a millisecond)."""
    summary = summary_pb2.Summary()
    for key, value in values.items():
        entry = summary.value.add(tag=key)
        entry.metadata.CopyFrom(_SCALAR)
        entry.tensor.dtype = types_pb2.DT_FLOAT
        entry.tensor.tensor_shape.SetInParent()
        entry.tensor.float_val.append(float(value))
    return summary.SerializeToString()


def image_tensor(images) -> tf.Tensor:
    """`[k, h, w, c]` floats in [0, 1] as the images plugin's tensor: width, height, then one PNG
    per image (what tf.summary.image writes)."""
    images = tf.cast(images, tf.float32)  # bfloat16 or float16 under mixed precision
    pixels = tf.cast(tf.round(tf.clip_by_value(images, 0.0, 1.0) * 255.0), tf.uint8)
    pngs = tf.map_fn(tf.io.encode_png, pixels, fn_output_signature=tf.string)
    size = tf.strings.as_string(tf.shape(images)[2:0:-1])  # width, height
    return tf.concat([size, pngs], axis=0)


def histogram_buckets(values: np.ndarray, bins: int = 30) -> np.ndarray:
    """`[bins, 3]` rows of (left edge, right edge, count): the histogram plugin's tensor format."""
    values = np.asarray(values, np.float64).reshape(-1)
    counts, edges = np.histogram(values, bins=bins)
    return np.stack([edges[:-1], edges[1:], counts], axis=1)


class MetricSink(Protocol):
    """Receives metrics as training goes (e.g. MLflow); `log` must not raise on outages."""

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class Summaries:
    """TensorBoard writers under `<work_dir>/tensorboard/{train,validation,eval}` (each made when
    first written to) plus the metric sinks, which also get `exported/...` (no writer)."""

    SPLITS = ("train", "validation", "eval")

    def __init__(self, work_dir: str | None, enabled: bool, sinks: Sequence[MetricSink] = ()):
        self.sinks = list(sinks)
        self.writers = {}
        self.folder = os.path.join(work_dir, "tensorboard") if work_dir and enabled else None

    def _writer(self, split: str):
        if self.folder is None or split not in self.SPLITS:
            return None
        if split not in self.writers:
            self.writers[split] = tf.summary.create_file_writer(os.path.join(self.folder, split))
        return self.writers[split]

    def scalars(self, split: str, step: int, values: dict[str, float]) -> None:
        writer = self._writer(split)
        if writer and values:
            with writer.as_default(step=step):
                tf.summary.experimental.write_raw_pb(scalars_summary(values))
        for sink in self.sinks:
            sink.log(step, {f"{split}/{k}": float(v) for k, v in values.items()})

    def histograms(self, step: int, values: dict[str, np.ndarray]) -> None:
        writer = self._writer("train")
        if writer:
            with writer.as_default(step=step):
                for key, value in values.items():
                    tf.summary.write(key, histogram_buckets(value), metadata=_HISTOGRAM)

    def images(self, split: str, step: int, values: dict) -> None:
        """`{tag: [k, h, w, c] floats in [0, 1]}` for TensorBoard's images dashboard."""
        writer = self._writer(split)
        if writer:
            with writer.as_default(step=step):
                for key, value in values.items():
                    tf.summary.write(key, image_tensor(value), metadata=_IMAGE)

    def close(self) -> None:
        for writer in self.writers.values():
            writer.flush()
            writer.close()


class Progress:
    """A tqdm bar over the run's steps on a terminal; a log line per report otherwise. `log`:
    where the per-evaluation lines go (with a bar, the log only)."""

    def __init__(self, mode: str, total_steps: int, initial: int = 0, log_every_seconds: float = 30.0):
        self.bar = None
        self.log_every_seconds = log_every_seconds
        self.last_log = time.monotonic()
        if mode == "bar" or (mode == "auto" and sys.stderr.isatty()):
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=initial, unit="step", dynamic_ncols=True)
        self.log = log if self.bar is not None else progress_log

    def update(self, step: int, values: dict[str, float]) -> None:
        shown = {k: f"{v:.4g}" for k, v in values.items() if k in ("loss", "examples_per_sec", "learning_rate")}
        if self.bar is not None:
            self.bar.n = step
            self.bar.set_postfix(shown, refresh=True)
        elif time.monotonic() - self.last_log >= self.log_every_seconds:
            self.last_log = time.monotonic()
            progress_log.info("step %d %s", step, " ".join(f"{k}={v}" for k, v in shown.items()))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
