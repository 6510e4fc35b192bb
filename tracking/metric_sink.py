"""A MetricSink (trainer.loop) that sends training metrics to MLflow in batches from a background
thread, so training never waits on the network and never sees an exception from it.

When the server is down the metrics stay in memory and are retried with backoff. At the end,
`close()` waits a bounded time; whatever is still unsent is written to a JSON-lines file that
`replay()` sends later (the Registrar does it), and the report says so. Nothing is dropped silently.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from mlflow.entities import Metric

log = logging.getLogger("loopline.tracking")

MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limit
UNDELIVERED_FILE = "undelivered_metrics.jsonl"


@dataclass
class DeliveryReport:
    run_id: str | None
    delivered: int
    undelivered: int
    spill_path: str | None
    last_error: str | None

    def line(self) -> str:
        if not self.undelivered:
            return f"MLflow: {self.delivered} metric values delivered to run {self.run_id}"
        where = f"saved to {self.spill_path} for replay" if self.spill_path else "NOT saved"
        return (f"MLflow: {self.undelivered} of {self.delivered + self.undelivered} metric values were not "
                f"delivered (last error: {self.last_error}); {where}")


class MlflowMetricSink:
    """`open_run()` returns the run id (creating the run on first success) or raises; `log_batch`
    is `MlflowClient.log_batch`. Both are only called from the sender thread."""

    def __init__(
        self,
        open_run: Callable[[], str],
        log_batch: Callable[..., None],
        flush_interval_s: float = 2.0,
        close_timeout_s: float = 30.0,
        spill_path: str | None = None,
        max_backoff_s: float = 30.0,
    ):
        self._open_run = open_run
        self._log_batch = log_batch
        self._interval = flush_interval_s
        self._close_timeout = close_timeout_s
        self._spill_path = spill_path
        self._max_backoff = max_backoff_s
        self._pending: list[Metric] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._delivered = 0
        self.run_id: str | None = None
        self.last_error: str | None = None
        self._failures = 0
        self._thread = threading.Thread(target=self._run, name="mlflow-metric-sink", daemon=True)
        self._thread.start()

    # MetricSink protocol -------------------------------------------------------------------
    def log(self, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        batch = [Metric(key, float(value), now, int(step)) for key, value in metrics.items()]
        with self._lock:
            self._pending.extend(batch)
        if self._interval == 0:
            self._wake.set()

    def close(self) -> DeliveryReport:
        self._closing = True
        self._wake.set()
        self._thread.join(self._close_timeout)
        with self._lock:
            left = list(self._pending)
            self._pending.clear()
        spill = None
        if left and self._spill_path:
            try:
                write_metrics(self._spill_path, left)
                spill = self._spill_path
            except OSError as exc:
                log.error("could not save %d undelivered metric values to %s: %s", len(left), self._spill_path, exc)
        report = DeliveryReport(self.run_id, self._delivered, len(left), spill, self.last_error)
        (log.warning if left else log.info)("%s", report.line())
        return report

    # Sender thread --------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait(self._wait_time())
            self._wake.clear()
            closing = self._closing
            self._flush()
            if closing:
                # One last round after close() so metrics logged just before it go out too.
                with self._lock:
                    empty = not self._pending
                if empty or self._failures:
                    return

    def _wait_time(self) -> float:
        if self._failures:
            return min(self._max_backoff, 0.5 * 2 ** min(self._failures, 10))
        return self._interval if self._interval > 0 else 1.0

    def _flush(self) -> None:
        with self._lock:
            batch = self._pending[:MAX_METRICS_PER_BATCH]
        if not batch:
            return
        try:
            if self.run_id is None:
                self.run_id = self._open_run()
            self._log_batch(self.run_id, metrics=batch)
        except Exception as exc:  # never into training: keep the metrics, retry later
            self._failures += 1
            self.last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            if self._failures == 1:
                log.warning("MLflow unreachable, buffering metrics and retrying: %s", self.last_error)
            return
        if self._failures:
            log.info("MLflow reachable again; sending %d buffered metric values", len(self._pending))
        self._failures = 0
        with self._lock:
            del self._pending[: len(batch)]
            more = bool(self._pending)
        self._delivered += len(batch)
        if more:
            self._wake.set()


def write_metrics(path: str, metrics: list[Metric]) -> None:
    import tensorflow as tf  # the spill file lives in an artifact folder, maybe on gs://...

    with tf.io.gfile.GFile(path, "a") as f:
        for m in metrics:
            f.write(json.dumps({"key": m.key, "value": m.value, "timestamp": m.timestamp, "step": m.step}) + "\n")


def read_metrics(path: str) -> list[Metric]:
    import tensorflow as tf

    with tf.io.gfile.GFile(path) as f:
        rows = [json.loads(line) for line in f.read().splitlines() if line.strip()]
    return [Metric(r["key"], r["value"], r["timestamp"], r["step"]) for r in rows]


def replay(client, run_id: str, path: str) -> int:
    """Sends metrics saved by a sink that could not deliver them; returns how many."""
    metrics = read_metrics(path)
    for start in range(0, len(metrics), MAX_METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=metrics[start:start + MAX_METRICS_PER_BATCH])
    return len(metrics)
