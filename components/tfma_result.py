"""The Evaluator's per-slice figures (trainer.slice_gates' report) written in TensorFlow Model
Analysis' own format, with TFMA's protos: `eval_config.json` (an EvalRun), `metrics*.tfrecord`
(MetricsForSlice), `plots*.tfrecord` (PlotsForSlice: each classifier's confusion matrix per slice,
the overall calibration histogram, and where a metrics_spec names ConfusionMatrixPlot or
CalibrationPlot each binary head's confusion matrices at TFMA's thresholds, or its calibration
histogram in TFMA's buckets, per slice) and `validations.tfrecord`
(ValidationResult), so that `tfma.load_eval_result(folder)` reads them. Only TFMA's protos are
imported: the package is heavy."""
from __future__ import annotations

import os
import re

import numpy as np
import tensorflow as tf

from trainer.evaluator_config import SlicingSpec, micro_figure
from trainer.slicing import PLOT_THRESHOLDS

CANDIDATE, BASELINE = "candidate", "baseline"  # TFMA's model names for a candidate and its baseline
MICRO_SUFFIX = micro_figure("")  # trainer.evaluator_config.micro_figure's

# loopline's per-head metric suffixes as TFMA names them (metric key name, per output = head).
_TFMA_NAMES = {"loss": "loss", "accuracy": "accuracy", "rmse": "root_mean_squared_error",
               "mse": "mean_squared_error", "mae": "mean_absolute_error", "examples": "example_count",
               "mape": "mean_absolute_percentage_error", "msle": "mean_squared_logarithmic_error",
               "unseen_label_examples": "unseen_label_examples"}


def write_eval_result(folder: str, report: dict, config, heads: list[str], candidate_path: str,
                      champion_path: str | None, data_location: str) -> None:
    """`report`: the Blessing's slices (trainer.slice_gates.slice_report, gated); `config`: the
    EvaluatorConfig; `heads`: the candidate's head names (a metric `<head>_x` is output `head`)."""
    # In this order: TFMA's generated modules do not import the protos they depend on (its package's
    # __init__ does, and `loopline run` defers that import).
    from tensorflow_model_analysis.proto import config_pb2, metrics_for_slice_pb2  # noqa: F401
    from tensorflow_model_analysis.proto import validation_result_pb2

    tf.io.gfile.makedirs(folder)
    compared = any(s["champion"] for s in report["slices"])
    locations = {CANDIDATE: candidate_path, **({BASELINE: champion_path} if compared and champion_path else {})}
    with tf.io.gfile.GFile(os.path.join(folder, "eval_config.json"), "w") as f:
        f.write(eval_run_json(eval_config(config, compared, report.get("_heads", {})), data_location, locations))
    kinds = report.get("_kinds", {})
    with tf.io.TFRecordWriter(os.path.join(folder, "metrics-00000-of-00001.tfrecord")) as writer:
        for entry in report["slices"]:
            writer.write(metrics_for_slice(entry, heads, kinds, compared).SerializeToString())
    with tf.io.TFRecordWriter(os.path.join(folder, "plots-00000-of-00001.tfrecord")) as writer:
        for entry in report["slices"]:
            plots = plots_for_slice(entry, kinds, report["calibration"] if not entry["features"] else {})
            if plots.plot_keys_and_values:
                writer.write(plots.SerializeToString())
    result = validation_result_pb2.ValidationResult(validation_ok=all(g["passed"] for g in report["gates"]))
    failing = {}
    for g in report["gates"]:
        if g.get("missing"):  # a threshold no evaluated slice is of (trainer.slice_gates._missing)
            result.missing_slices.extend(tfma_slicing_spec(SlicingSpec(**spec)) for spec in g["missing"])
        elif not g["passed"]:
            entry = next(s for s in report["slices"] if s["slice"] == g["slice"])
            if g["slice"] not in failing:
                failing[g["slice"]] = result.metric_validations_per_slice.add(slice_key=slice_key(entry, kinds))
            failure = failing[g["slice"]].failures.add(message=g["text"])
            failure.metric_key.CopyFrom(metric_key(g["metric"], heads, CANDIDATE))
            if g["candidate"] is not None:
                failure.metric_value.double_value.value = g["candidate"]
    with tf.io.TFRecordWriter(os.path.join(folder, "validations.tfrecord")) as writer:
        writer.write(result.SerializeToString())


def eval_run_json(config, data_location: str, locations: dict[str, str]) -> str:
    """`eval_config.json` as TFMA's writer serializes its EvalRun (eval_config_writer): its
    protos only, not the writer's module, whose import loads all of TFMA (about 2 CPU seconds)."""
    from importlib import metadata

    from google.protobuf import json_format
    from tensorflow_model_analysis.proto import config_pb2

    return json_format.MessageToJson(config_pb2.EvalRun(
        eval_config=config, version=metadata.version("tensorflow-model-analysis"), data_location=data_location,
        file_format="tfrecords", model_locations=locations))


def metric_key(name: str, heads: list[str], model_name: str, is_diff: bool = False):
    """`<head>_<suffix>` as (output head, TFMA's name); others (`loss`, `weighted_loss`) on no output."""
    from tensorflow_model_analysis.proto import metrics_for_slice_pb2

    for head in sorted(heads, key=len, reverse=True):  # the longest head name that prefixes it
        if name.startswith(f"{head}_"):
            suffix, class_id = _class_of(name[len(head) + 1:])
            micro = suffix.endswith(MICRO_SUFFIX)
            suffix = suffix[:-len(MICRO_SUFFIX)] if micro else suffix
            key = metrics_for_slice_pb2.MetricKey(name=_TFMA_NAMES.get(suffix, suffix), output_name=head,
                                                  model_name=model_name, is_diff=is_diff)
            if class_id is not None:  # a binarized figure (MetricsSpec.binarize): TFMA's sub key
                key.sub_key.class_id.value = class_id
            if micro:  # micro-averaged (MetricsSpec.aggregate): TFMA's aggregation type
                key.aggregation_type.micro_average = True
            return key
    return metrics_for_slice_pb2.MetricKey(name=name, model_name=model_name, is_diff=is_diff)


def _class_of(suffix: str) -> tuple[str, int | None]:
    """`recall_class_2` -> ("recall", 2) (trainer.evaluator_config.class_figure); others unchanged."""
    match = re.fullmatch(r"(.+)_class_(\d+)", suffix)
    return (match.group(1), int(match.group(2))) if match else (suffix, None)


def slice_key(entry: dict, kinds: dict[str, str]):
    """TFMA's SliceKey: each feature's value typed as the examples store it (a bucket is its text)."""
    from tensorflow_model_analysis.proto import metrics_for_slice_pb2

    key = metrics_for_slice_pb2.SliceKey()
    for column, text in entry["features"].items():
        single = key.single_slice_keys.add(column=column)
        kind = kinds.get(column, "string")
        if kind == "int64" and not text.startswith(("(", "[")):
            single.int64_value = int(text)
        elif kind == "float32" and not text.startswith(("(", "[")):
            single.float_value = float(text)
        else:
            single.bytes_value = text.encode()
    return key


def metrics_for_slice(entry: dict, heads: list[str], kinds: dict[str, str], compared: bool):
    from tensorflow_model_analysis.proto import metrics_for_slice_pb2

    out = metrics_for_slice_pb2.MetricsForSlice(slice_key=slice_key(entry, kinds))

    def add(key, value: float) -> None:
        pair = out.metric_keys_and_values.add()
        pair.key.CopyFrom(key)
        pair.value.double_value.value = float(value)

    add(metrics_for_slice_pb2.MetricKey(name="example_count", model_name=CANDIDATE), entry["examples"])
    for name, value in entry["candidate"].items():
        add(metric_key(name, heads, CANDIDATE), value)
    for name, value in (entry["champion"] or {}).items() if compared else ():
        add(metric_key(name, heads, BASELINE), value)
        if name in entry["candidate"]:  # TFMA's diff: candidate - baseline, under the candidate
            add(metric_key(name, heads, CANDIDATE, is_diff=True), entry["candidate"][name] - value)
    return out


def plots_for_slice(entry: dict, kinds: dict[str, str], calibration: dict[str, list[dict]]):
    """The slice's confusion matrices (TFMA's multi_class_confusion_matrix_plot, at threshold 0:
    the top class predicted), then, as TFMA's writer combines them in one plot without a name,
    `entry`'s binary confusion matrices at thresholds (ConfusionMatrixPlot, where named) and
    calibration histograms: in TFMA's buckets where CalibrationPlot is named (every slice), else
    `calibration`'s bins (Overall). tfma.load_eval_result keys plots by output, so it shows an
    output's last one: the binary one."""
    from tensorflow_model_analysis.proto import metrics_for_slice_pb2

    out = metrics_for_slice_pb2.PlotsForSlice(slice_key=slice_key(entry, kinds))
    for head, confusion in entry["confusion"].items():
        plot = out.plot_keys_and_values.add()
        plot.key.CopyFrom(metrics_for_slice_pb2.PlotKey(name="multi_class_confusion_matrix_plot", output_name=head,
                                                        model_name=CANDIDATE))
        matrix = plot.value.multi_class_confusion_matrix_at_thresholds.matrices.add(threshold=0.0)
        for actual, row in enumerate(confusion["matrix"]):
            for predicted, count in enumerate(row):
                matrix.entries.add(actual_class_id=actual, predicted_class_id=predicted, num_weighted_examples=count)
    binary = {}  # TFMA's writer puts an output's ConfusionMatrixPlot and CalibrationPlot in one unnamed plot

    def binary_plot(head: str):
        if head not in binary:
            plot = out.plot_keys_and_values.add()
            plot.key.CopyFrom(metrics_for_slice_pb2.PlotKey(output_name=head, model_name=CANDIDATE))
            binary[head] = plot.value
        return binary[head]

    for head, counts in entry.get("_plot_counts", {}).items():
        confusion_matrices(binary_plot(head).confusion_matrix_at_thresholds, *counts)
    tfma_calibration = entry.get("_calibration_plot", {})
    for head, sums in tfma_calibration.items():
        calibration_buckets(binary_plot(head).calibration_histogram_buckets, sums)
    for head, bins in calibration.items():
        if head in tfma_calibration:
            continue
        for b in bins:
            bucket = binary_plot(head).calibration_histogram_buckets.buckets.add(
                lower_threshold_inclusive=b["lower"], upper_threshold_exclusive=b["upper"])
            bucket.num_weighted_examples.value = b["examples"]
            bucket.total_weighted_label.value = b["observed"] * b["examples"]
            bucket.total_weighted_refined_prediction.value = b["mean_prediction"] * b["examples"]
    return out


def calibration_buckets(out, sums: np.ndarray) -> None:
    """TFMA's CalibrationPlot (its 1,000 buckets over [0, 1], with (-inf, 0) and [1, inf) at the
    ends, every one written) from trainer.slicing.calibration_plot_sums, as its _to_proto fills it."""
    n = len(sums) - 2
    bounds = [float("-inf"), *(i * 1.0 / n for i in range(n + 1)), float("inf")]
    for i, (examples, labels, predictions) in enumerate(np.asarray(sums, np.float64).tolist()):
        out.buckets.add(lower_threshold_inclusive=bounds[i], upper_threshold_exclusive=bounds[i + 1],
                        total_weighted_label={"value": labels}, total_weighted_refined_prediction={"value": predictions},
                        num_weighted_examples={"value": examples})


def confusion_matrices(out, tp, fp, fn, tn) -> None:
    """TFMA's ConfusionMatrixAtThresholds at trainer.slicing.PLOT_THRESHOLDS, as TFMA's Matrices.to_proto
    fills it: precision 1 and recall 0 where undefined, the false omission rate NaN."""

    def ratio(numerator, denominator, undefined):
        return np.divide(numerator, denominator, out=np.full_like(denominator, undefined, dtype=np.float64),
                         where=denominator > 0)

    precision, recall = ratio(tp, tp + fp, 1.0), ratio(tp, tp + fn, 0.0)
    f1 = ratio(2 * precision * recall, precision + recall, 0.0)
    accuracy, fall_out = ratio(tp + tn, tp + tn + fp + fn, 0.0), ratio(fp, tn + fp, 0.0)
    omission = ratio(fn, tn + fn, np.nan)
    for i, threshold in enumerate(PLOT_THRESHOLDS):
        out.matrices.add(threshold=round(float(threshold), 6), true_positives=tp[i], false_positives=fp[i],
                         true_negatives=tn[i], false_negatives=fn[i], precision=precision[i], recall=recall[i],
                         false_positive_rate=fall_out[i], false_omission_rate=omission[i], f1=f1[i],
                         accuracy=accuracy[i])


def eval_config(config, compared: bool, heads: dict[str, str] | None = None):
    """The EvalConfig this evaluation is equivalent to: the models, the slicing specs (overall first;
    loopline's buckets have no TFMA field and are left out of the spec), the per-slice thresholds
    and metrics_specs' (on the slices they apply to, named by loopline's figures; `heads`: name -> kind)."""
    from tensorflow_model_analysis.proto import config_pb2

    specs = [config_pb2.ModelSpec(name=CANDIDATE, signature_name=config.signature_name, label_key=config.label_key or "",
                                  prediction_key=config.prediction_key)]
    if compared:
        specs.append(config_pb2.ModelSpec(name=BASELINE, is_baseline=True, signature_name=config.signature_name,
                                          prediction_key=config.prediction_key))
    out = config_pb2.EvalConfig(model_specs=specs, slicing_specs=[config_pb2.SlicingSpec()])
    out.slicing_specs.extend(tfma_slicing_spec(s) for s in config.slicing_specs)
    metrics = out.metrics_specs.add()
    for t in [*config.slice_thresholds, *config.metric_thresholds(heads or {})]:
        threshold = config_pb2.MetricThreshold()
        if t.value_threshold is not None:
            for bound in ("lower_bound", "upper_bound"):
                if getattr(t.value_threshold, bound) is not None:
                    getattr(threshold.value_threshold, bound).value = getattr(t.value_threshold, bound)
        if t.change_threshold is not None:
            threshold.change_threshold.direction = config_pb2.MetricDirection.Value(t.change_threshold.direction.upper())
            for bound in ("absolute", "relative"):
                if getattr(t.change_threshold, bound) is not None:
                    getattr(threshold.change_threshold, bound).value = getattr(t.change_threshold, bound)
        metrics.per_slice_thresholds[t.metric].thresholds.add(
            slicing_specs=[tfma_slicing_spec(s) for s in t.slicing_specs], threshold=threshold)
    return out


def tfma_slicing_spec(spec):
    from tensorflow_model_analysis.proto import config_pb2

    return config_pb2.SlicingSpec(feature_keys=list(spec.feature_keys), feature_values=dict(spec.feature_values))
