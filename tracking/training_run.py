"""The Trainer's side of tracking: opens the pipeline run's MLflow run (lazily, so a server that is
down at the start only delays it), gives the training loop a metric sink, and logs the trainer's
files at the end. Nothing here raises into training."""
from __future__ import annotations

import logging
import os

import tensorflow as tf

from tracking.metric_sink import UNDELIVERED_FILE, DeliveryReport, MlflowMetricSink
from tracking.remote_files import local_view
from tracking.system_info import system_tags
from tracking.target import TrackingTarget, ensure_experiment, make_client

log = logging.getLogger("loopline.tracking")

# Tags shared by the components that write into one run.
TAG_PIPELINE = "loopline.pipeline"
TAG_PIPELINE_RUN_ID = "loopline.pipeline_run_id"
TAG_MODEL_URI = "loopline.model_uri"
TFLITE_DROPPED_TAG = "loopline.tflite_dropped"  # {variant: why}: TFLite variants that missed parity and were dropped
EXPORTED_TAG = "loopline.exported_weights"  # which weights were exported, in words (epoch, step, selecting metric)


class TrainingRun:
    def __init__(self, target: TrackingTarget, tags: dict[str, str], spill_dir: str):
        self.target = target
        self.client = make_client(target)
        self._tags = tags
        self.sink = MlflowMetricSink(
            self._open,
            self.client.log_batch,
            flush_interval_s=target.flush_interval_s,
            close_timeout_s=target.close_timeout_s,
            spill_path=os.path.join(spill_dir, UNDELIVERED_FILE),
        )

    def _open(self) -> str:
        experiment_id = ensure_experiment(self.client, self.target)
        tags = {**self._tags, **system_tags()}
        run = self.client.create_run(experiment_id, tags=tags, run_name=self._tags.get(TAG_PIPELINE))
        log.info("MLflow run %s in experiment %r at %s", run.info.run_id, self.target.experiment, self.target.tracking_uri)
        return run.info.run_id

    def finish(self, artifact_dirs: dict[str, str], failed: bool = False, tags: dict[str, str] | None = None,
               params: dict[str, str] | None = None) -> DeliveryReport:
        """Flushes the metrics (bounded), then sets the tags, logs the parameters and each folder
        under its artifact path."""
        report = self.sink.close()
        if report.run_id is None:
            return report
        for key, value in (tags or {}).items():
            try:
                self.client.set_tag(report.run_id, key, value)
            except Exception as exc:
                log.error("MLflow: could not set tag %s on run %s: %s", key, report.run_id, exc)
        if params:
            from mlflow.entities import Param

            try:
                batch = [Param(k, str(v)[:6000]) for k, v in params.items()]
                for start in range(0, len(batch), 100):
                    self.client.log_batch(report.run_id, params=batch[start:start + 100])
            except Exception as exc:
                log.error("MLflow: could not log the parameters of run %s: %s", report.run_id, exc)
        for artifact_path, folder in artifact_dirs.items():
            try:
                if not tf.io.gfile.isdir(folder) or not tf.io.gfile.listdir(folder):
                    log.warning("MLflow: nothing to log as %r: %s is empty or missing", artifact_path, folder)
                    continue
                with local_view(folder) as local:
                    self.client.log_artifacts(report.run_id, local, artifact_path)
            except Exception as exc:
                log.error("MLflow: could not log %s as artifacts %r: %s", folder, artifact_path, exc)
        try:
            self.client.set_terminated(report.run_id, "FAILED" if failed else "FINISHED")
        except Exception as exc:
            log.warning("MLflow: could not mark run %s finished: %s", report.run_id, exc)
        return report


def start_training_run(target_json: str, tags: dict[str, str], spill_dir: str) -> TrainingRun | None:
    """None when tracking is off (empty JSON) or cannot even be configured (logged)."""
    if not target_json:
        return None
    try:
        return TrainingRun(TrackingTarget.from_json(target_json), tags, spill_dir)
    except Exception as exc:
        log.error("MLflow tracking disabled for this training: %s", exc)
        return None
