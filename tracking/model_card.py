"""A pushed version's model card: what it is on one page. This module gathers the card's content
into a plain dict (the lineage, the blessing and why, the per-slice figures, the TFLite variants
and their parity, the training curves, known limits) and writes it where it belongs;
tracking.card_render turns the dict into HTML, Markdown and PNG files.

The card lives inside the version folder, `<base>/<model>/<version>/assets.extra/model_card/`:
whatever copies, serves or removes a version (retention) takes its card along, and TF Serving
reads nothing in assets.extra but its warmup file. Every path goes through tf.io.gfile: the
serving folder may be on gs://."""
from __future__ import annotations

import datetime
import json
import os

import tensorflow as tf
from tensorflow.core.util import event_pb2

from serving.signature_names import ASSETS_EXTRA

CARD_FOLDER = "model_card"
CARD_HTML = "model_card.html"
CARD_MD = "model_card.md"
CARD_JSON = "model_card.json"
BLESSING_JSON = "blessing.json"
CURVE_PREFIXES = ("train/loss", "eval/")  # the training curves: the loss as trained, every eval metric


def card_folder(version_path: str) -> str:
    return os.path.join(version_path, ASSETS_EXTRA, CARD_FOLDER)


def read_json(path: str) -> dict | None:
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def slices_file() -> str:
    from trainer.slicing import SLICES_JSON

    return SLICES_JSON


def training_curves(client, run_id: str | None) -> dict[str, list[list[float]]]:
    """{metric: [[step, value], ...]} from the MLflow run the Trainer logged into; {} without one."""
    if client is None or not run_id:
        return {}
    names = [k for k in client.get_run(run_id).data.metrics if k.startswith(CURVE_PREFIXES)
             and not k.endswith("_examples")]
    curves = {}
    for name in sorted(names):
        history = sorted(client.get_metric_history(run_id, name), key=lambda m: (m.step, m.timestamp))
        if len(history) > 1:  # one point is no curve
            curves[name] = [[m.step, m.value] for m in history]
    return curves


def tensorboard_curves(model_run_uri: str | None) -> dict[str, list[list[float]]]:
    """The same curves from the Trainer's TensorBoard files (`<model_run>/tensorboard/<split>`),
    for a run without MLflow."""
    curves: dict[str, list[list[float]]] = {}
    for split in ("train", "eval"):
        pattern = os.path.join(model_run_uri or "", "tensorboard", split, "events.out.tfevents.*")
        for path in tf.io.gfile.glob(pattern) if model_run_uri else []:
            for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
                event = event_pb2.Event.FromString(record)
                for value in event.summary.value:
                    number = tf.make_ndarray(value.tensor) if value.HasField("tensor") else value.simple_value
                    if getattr(number, "size", 1) == 1:  # scalars only, not histograms or images
                        curves.setdefault(f"{split}/{value.tag}", []).append([event.step, float(number)])
    return {k: sorted(v) for k, v in sorted(curves.items())
            if k.startswith(CURVE_PREFIXES) and not k.endswith("_examples") and len(v) > 1}


def curves_of(client, run_id: str | None, model_run_uri: str | None) -> dict[str, list[list[float]]]:
    """The training curves from MLflow, else from the TensorBoard files."""
    return training_curves(client, run_id) or tensorboard_curves(model_run_uri)


def export_summary(report: dict | None) -> dict | None:
    """The SavedModel's size and latency and each TFLite variant's parity, from the export report."""
    if report is None:
        return None
    keep = ("variant", "size_bytes", "max_abs_diff", "metric_delta", "latency_ms", "examples", "problems",
            "dropped", "passed")
    return {"saved_model": report.get("saved_model", {}),
            "tflite": [{k: v for k, v in variant.items() if k in keep} for variant in report.get("tflite", [])]}


def known_limits(lineage: dict, blessing: dict | None, slices: dict | None, export: dict | None) -> list[str]:
    """What the card's reader should not assume, from the config and the run's own records."""
    config = lineage.get("config", {})
    limits = [f"Trained and evaluated only on {config.get('data.path', '?')}"
              + (f" (eval split: {config['data.eval_path']})" if config.get("data.eval_path") not in (None, "None")
                 else " (cut into train and eval splits by hash)") + "; other populations are not measured."]
    stats = (lineage.get("statistics") or {}).get("examples") or {}
    if stats:
        limits.append("Figures come from " + ", ".join(f"{n} {s} examples" for s, n in stats.items()) + ".")
    if not any(k.startswith("evaluator.thresholds.") for k in config) and config.get("evaluator.thresholds") in (None, "{}"):
        limits.append("No absolute thresholds were set (evaluator.thresholds): the model was held to the trivial "
                      "model and the champion only.")
    if blessing is not None and not blessing.get("champion"):
        limits.append("No champion was compared: this version was not checked against a served model.")
    if slices is None:
        limits.append("No per-slice figures were computed: quality on subgroups is unknown.")
    else:
        small = [s["slice"] for s in slices.get("slices", []) if not s.get("gated")]
        if small:
            limits.append(f"Slices not gated (fewer than {slices.get('min_slice_size')} examples, or not gated by "
                          f"config): {', '.join(small[:10])}{' ...' if len(small) > 10 else ''}.")
    dropped = [v["variant"] for v in (export or {}).get("tflite", []) if v.get("dropped")]
    if dropped:
        limits.append(f"TFLite variants dropped by the parity gate: {', '.join(dropped)}.")
    if (lineage.get("data_baseline") or {}).get("accepted_changes"):
        limits.append(f"Trained on data changes accepted by hand: {lineage['data_baseline']['accepted_changes']}.")
    return limits


def card_content(lineage: dict, curves: dict | None = None) -> dict:
    """Everything the card shows, JSON-ready."""
    blessing_uri = (lineage.get("blessing") or {}).get("uri")
    model_uri = (lineage.get("model_artifact") or {}).get("uri")
    blessing = read_json(os.path.join(blessing_uri, BLESSING_JSON)) if blessing_uri else None
    slices = read_json(os.path.join(blessing_uri, slices_file())) if blessing_uri else None
    from trainer.export import REPORT_JSON

    report = next((r for r in (read_json(os.path.join(d, REPORT_JSON)) for d in (blessing_uri, model_uri) if d)
                   if r is not None), None)
    export = export_summary(report)
    return {
        "title": f"{lineage['model']} version {lineage['version']}",
        "generated_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "lineage": lineage,
        "blessing": blessing,
        "slices": slices,
        "export": export,
        "curves": curves or {},
        "limits": known_limits(lineage, blessing, slices, export),
    }


def write_card(content: dict, folder: str) -> str:
    """Writes the card's files into `folder`; returns the HTML page's path."""
    from tracking.card_render import render_card

    tf.io.gfile.makedirs(folder)
    for name, data in render_card(content).items():
        with tf.io.gfile.GFile(os.path.join(folder, name), "wb") as f:
            f.write(data)
    return os.path.join(folder, CARD_HTML)


def log_card(client, run_id: str, folder: str) -> None:
    """The card's files as the MLflow run's `model_card/` artifacts."""
    from tracking.remote_files import local_view

    with local_view(folder) as local:
        client.log_artifacts(run_id, local, CARD_FOLDER)
