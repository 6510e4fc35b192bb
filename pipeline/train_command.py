"""`loopline train`: the trainer alone, as the TFJob runs it on each worker.

The chief (TF_CONFIG's chief, else worker 0) exports what the pipeline's Trainer exports, in the
Model artifact's layout under `<work-dir>/model/` (SavedModel in `Format-Serving` with its warmup
file, TFLite variants behind the parity gate, the export report), writes `metrics.json` and logs
the run to MLflow; every worker keeps its own checkpoint copy (trainer.checkpoints). Every path
may be on a remote filesystem (gs://...): all of it goes through tf.io.gfile.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import tensorflow as tf

from pipeline.config import ConfigError, LooplineConfig, is_remote

SERVING_MODEL_DIR = "Format-Serving"  # TFX's path_utils.serving_model_path layout, as the Pusher reads it
METRICS_FILE = "metrics.json"


@dataclass
class TrainOutcome:
    work_dir: str
    steps: int
    metrics: dict[str, float]
    chief: bool
    model_dir: str | None  # None on workers that are not the chief
    mlflow_run_id: str | None


def default_work_dir(config: LooplineConfig, work_dir: str | None) -> str:
    work_dir = work_dir or os.path.join(config.pipeline.root, "train", config.pipeline.name)
    return work_dir if is_remote(work_dir) else os.path.abspath(work_dir)


def _splits(config: LooplineConfig, work_dir: str, train: str | None, eval_: str | None, task) -> tuple[str, str]:
    if train and eval_:
        return train, eval_
    if train or eval_:
        raise ConfigError("--train and --eval go together")
    # Each worker converts its own copy: two processes must not write the same files.
    data_dir = os.path.join(work_dir, "data") if task is None else os.path.join(work_dir, "data", f"{task[0]}-{task[1]}")
    if config.data.format == "image_folder":
        from ingestion.file_records import image_folder_splits

        return image_folder_splits(config.data.path, data_dir, config.data.eval_path)
    if config.data.format != "csv":
        raise ConfigError(f"loopline train reads data.path itself only for data.format csv and image_folder (not "
                          f"{config.data.format}); give --train and --eval (ExampleGen's GZIP TFRecord splits)")
    from trainer.csv_examples import csv_to_tfrecords

    if any(c in config.data.path for c in "*?["):
        raise ConfigError(f"loopline train reads one CSV file itself, not a glob ({config.data.path}); run the "
                          "pipeline, or give --train and --eval (ExampleGen's GZIP TFRecord splits)")

    return csv_to_tfrecords(config.data.path, data_dir, config.data.csv_options())


def run_train(config: LooplineConfig, work_dir: str | None = None, train: str | None = None,
              eval_: str | None = None) -> TrainOutcome:
    from pipeline.tracking_setup import tracking_target
    from trainer.export import export_model
    from trainer.loop import train as train_model
    from trainer.strategy import chief_task, tf_config_task
    from tracking.training_run import TAG_MODEL_URI, TAG_PIPELINE, start_training_run

    work_dir = default_work_dir(config, work_dir)
    task = tf_config_task()
    chief = task is None or chief_task(*task)
    train_pattern, eval_pattern = _splits(config, work_dir, train, eval_, task)
    model_dir = os.path.join(work_dir, "model")
    target = tracking_target(config) if chief else None
    run = start_training_run(target.to_json(), {TAG_PIPELINE: config.pipeline.name, TAG_MODEL_URI: model_dir},
                             spill_dir=work_dir) if target else None
    try:
        result = train_model(config.trainer, train_pattern, eval_pattern, config.data.label,
                             metric_sinks=[run.sink] if run else [], work_dir=work_dir,
                             label_kind=config.data.label_kind, max_classes=config.data.max_classes)
        metrics = {**result.metrics, "steps": result.steps}
        if chief:
            tf.io.gfile.makedirs(model_dir)
            export_model(result.model, result.kinds, result.heads, result.metrics,
                         os.path.join(model_dir, SERVING_MODEL_DIR), model_dir, train_pattern, eval_pattern,
                         config.export, default=config.data.label, exported=result.exported)
            with tf.io.gfile.GFile(os.path.join(work_dir, METRICS_FILE), "w") as f:
                f.write(json.dumps(metrics, indent=2))
    except BaseException:
        if run:
            run.finish({}, failed=True)
        raise
    run_id = None
    if run:
        report = run.finish({"model": model_dir}, params={k: str(v) for k, v in config.flat().items()})
        run_id = report.run_id
    return TrainOutcome(work_dir, result.steps, metrics, chief, model_dir if chief else None, run_id)
