"""The pipeline's Evaluator: evaluates the candidate, the champion and the trivial model (fitted
on the train split) on the eval split and writes the standard ModelBlessing artifact the Pusher
checks.

The champion is the served version behind the champion's TF Serving label (`loopline promote
--alias champion` moves the MLflow alias and that label together), else the last pushed version.

Its folder holds `BLESSED` or `NOT_BLESSED` (TFX's convention), `blessing.json` with every
check, the model's export report completed with the blessing decision, and the statistics of the
candidate's predictions on the eval split (components.eval_predictions, for the baseline), the
per-slice figures and gates (`slices.json`) and the same figures in TFMA's format (`tfma/`).
"""

import functools
import json
import logging
import os

from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component
from tfx.types import artifact_utils
from tfx.types.standard_artifacts import ExampleAnomalies, Examples, ExampleStatistics, Model, ModelBlessing
from tfx.utils import path_utils

from components.eval_predictions import PredictionSummary
from components.splits import EVAL_SPLIT, split_pattern
from serving.model_config import labelled_or_latest_version
from serving.signature_call import signature_caller


@component
def Evaluator(
    examples: InputArtifact[Examples],
    model: InputArtifact[Model],
    blessing: OutputArtifact[ModelBlessing],
    evaluator_config: Parameter[str],
    serving_root: Parameter[str] = "",
    model_name: Parameter[str] = "",
    champion_label: Parameter[str] = "",
    anomalies: InputArtifact[ExampleAnomalies] = None,
    statistics: InputArtifact[ExampleStatistics] = None,
) -> None:
    """`evaluator_config` is the `evaluator:` section as JSON; the champion is looked up in
    `serving_root` ("" for none) for `model_name`, by `champion_label` first. When the data
    validation accepted changes to the data (`anomalies`' `accepted_changes`), a champion that
    cannot read the new data does not refuse the candidate: it is blessed on the thresholds alone.
    With `statistics`, the trivial model is fitted from the train split's where they hold its
    labels exactly (train_label_summaries), else from the split's labels read again."""
    from trainer.blessing import evaluate_and_decide
    from trainer.evaluator_config import EvaluatorConfig
    from trainer.evaluation import eager_signature, is_loopline_export
    from trainer.model_spec import describe_model

    log = logging.getLogger("loopline.evaluator")
    config = EvaluatorConfig.model_validate_json(evaluator_config)
    eval_pattern = split_pattern(examples, EVAL_SPLIT)
    candidate = path_utils.serving_model_path(model.uri)
    champion = labelled_or_latest_version(serving_root, model_name, champion_label) if serving_root else None
    accepted = anomalies.get_string_custom_property("accepted_changes") if anomalies is not None else ""
    because = f"the data changed on purpose: {accepted}" if accepted else None
    # The candidate's predictions on the whole split are summarized on the way, for the baseline.
    predictions = PredictionSummary() if config.eval_examples is None else None

    @functools.cache  # asked for the candidate's and champion's again and again: a TFX model's is a load
    def describe(saved_model_dir: str) -> dict:  # a TFX run_fn's model as TFMA's ModelSpec names it
        return describe_model(saved_model_dir, config.label_key, config.signature_name, eval_pattern,
                              config.preprocessing_function_names, config.binary, config.prediction_key)

    def open_signature(saved_model_dir: str, signature: str, outputs=None):
        # loopline's exports are called as the server calls them: a Session callable per signature,
        # large batches. A TFX model's Keras 3 variables do not restore into a Session: called eagerly.
        if is_loopline_export(saved_model_dir):
            return signature_caller(saved_model_dir, signature, outputs=outputs)
        return eager_signature(saved_model_dir, signature, outputs=outputs)

    description = describe(candidate)
    decision = evaluate_and_decide(candidate, eval_pattern, champion, config, thresholds_only_because=because,
                                   open_signature=open_signature, train_pattern=split_pattern(examples, "train"),
                                   candidate_answers=predictions.add if predictions is not None else None,
                                   train_labels=train_label_summaries(statistics, description),
                                   describe=describe)
    log.info("model %s", decision.summary())
    _write_decision(blessing, model, decision)
    write_slices(blessing.uri, decision, config, [h["name"] for h in description["heads"]], candidate, eval_pattern)
    if predictions is not None:
        predictions.write(blessing, candidate)
    _record_decision(blessing, model, decision, accepted)


def _write_decision(blessing, model, decision) -> None:
    """BLESSED or NOT_BLESSED (TFX's convention), blessing.json, and the model's export report
    completed with the decision."""
    import tensorflow as tf

    from trainer.export import REPORT_JSON, write_report

    tf.io.gfile.makedirs(blessing.uri)  # Kubeflow's launcher does not create output folders
    with tf.io.gfile.GFile(os.path.join(blessing.uri, "BLESSED" if decision.blessed else "NOT_BLESSED"), "w") as f:
        f.write("")  # GFile creates the file on the first write
    with tf.io.gfile.GFile(os.path.join(blessing.uri, "blessing.json"), "w") as f:
        f.write(json.dumps(decision.to_json(), indent=2))
    report_path = os.path.join(model.uri, REPORT_JSON)
    if tf.io.gfile.exists(report_path):
        with tf.io.gfile.GFile(report_path) as f:
            write_report(blessing.uri, json.load(f), decision.to_json())
    else:
        logging.getLogger("loopline.evaluator").warning("no export report at %s; the blessing has no report beside it",
                                                        report_path)


def _record_decision(blessing, model, decision, accepted: str) -> None:
    """The blessing's properties: what the Pusher, the run summary and the Registrar read."""
    blessing.set_int_custom_property("blessed", 1 if decision.blessed else 0)
    blessing.set_string_custom_property("current_model", model.uri)
    blessing.set_int_custom_property("current_model_id", model.id)
    blessing.set_string_custom_property("baseline_model", decision.champion_path or "")
    blessing.set_string_custom_property("reasons", json.dumps(decision.reasons))
    blessing.set_string_custom_property("accepted_changes", accepted)
    for key, value in decision.candidate.items():
        blessing.set_float_custom_property(f"eval_{key}", float(value))
    for key, value in decision.trivial.items():  # the floor it was held to (the Registrar logs them)
        blessing.set_float_custom_property(f"trivial_{key}", float(value))


def write_slices(folder: str, decision, config, heads: list[str], candidate: str, eval_pattern: str) -> None:
    """slices.json (trainer.slicing.SLICES_JSON) and the same figures in TFMA's format (TFMA_FOLDER)."""
    import tensorflow as tf

    from components.tfma_result import write_eval_result
    from trainer.slicing import SLICES_JSON, TFMA_FOLDER

    if decision.slices is None:
        return
    with tf.io.gfile.GFile(os.path.join(folder, SLICES_JSON), "w") as f:
        f.write(json.dumps(decision.slices_json(), indent=2))
    write_eval_result(os.path.join(folder, TFMA_FOLDER), decision.slices, config, heads, candidate,
                      decision.champion_path, eval_pattern)


def train_label_summaries(statistics, description: dict) -> dict:
    """{head: what the trivial model is fitted from} for the heads whose train-split labels the
    statistics hold exactly: a string label's rows per class (exact rank histogram), a numeric
    label's mean over its finite values (validation.statistics.finite_mean). Integer class labels
    and inexact statistics are left out (read)."""
    if statistics is None or "train" not in artifact_utils.decode_split_names(statistics.split_names):
        return {}
    from trainer.heads import CLASSIFICATION, Head
    from validation.statistics import exact_class_counts, finite_mean, read_statistics

    train = read_statistics(artifact_utils.get_split_uri([statistics], "train"))
    summaries = {}
    for head in (Head.from_json(h) for h in description["heads"]):
        if head.kind == CLASSIFICATION:
            summary = exact_class_counts(train, head.label_column) if head.label_dtype == "string" else None
        else:
            summary = finite_mean(train, head.label_column) if head.label_dtype in ("float32", "int64") else None
        if summary is not None:
            summaries[head.name] = summary
    return summaries
