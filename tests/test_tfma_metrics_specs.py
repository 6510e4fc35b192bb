"""TFMA's metrics_specs in the Evaluator, and a binary classifier that answers one column (TFX's
taxi model: one sigmoid unit, or a logit): with a binary metric named, as TFX's taxi pipeline
names BinaryAccuracy, the column is read as the probability of the label 1 and the figures are a
classifier's (checked against scikit-learn's on the same rows); the metrics' thresholds gate the
overall figures as TFMA's do, with and without a champion."""
import numpy as np
import pytest
import tensorflow as tf
from pydantic import ValidationError
from sklearn.metrics import (average_precision_score, f1_score, log_loss, matthews_corrcoef, mean_squared_error, precision_score, recall_score,
                             roc_auc_score)

from trainer.blessing import evaluate_and_decide
from trainer.evaluator_config import EvaluatorConfig
from trainer.model_spec import describe_model
from trainer.predicted import signature_columns

LABEL = "tips"
# TFX's taxi pipeline's threshold, as its Python code writes it (DoubleValue bounds, the enum's name).
TAXI_ACCURACY = {"class_name": "BinaryAccuracy", "threshold": {
    "value_threshold": {"lower_bound": {"value": 0.6}},
    "change_threshold": {"direction": "HIGHER_IS_BETTER", "absolute": {"value": -1e-10}}}}


def write_split(path, x: np.ndarray, y: np.ndarray) -> str:
    with tf.io.TFRecordWriter(str(path), options="GZIP") as writer:
        for value, label in zip(x, y):
            example = tf.train.Example()
            example.features.feature["x"].float_list.value.append(float(value))
            example.features.feature[LABEL].int64_list.value.append(int(label))
            writer.write(example.SerializeToString())
    return str(path)


def one_column_model(path, weight: float, bias: float, logits: bool, outputs=None) -> str:
    """A SavedModel as a TFX run_fn saves one: `serving_default` parses serialized tf.Examples and
    answers one column, sigmoid(weight * x + bias) or that logit; `outputs(logit)`: its outputs instead."""
    module = tf.Module()

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve(examples):
        x = tf.io.parse_example(examples, {"x": tf.io.FixedLenFeature([1], tf.float32)})["x"]
        logit = weight * x + bias
        if outputs is not None:
            return outputs(logit)
        return {"output_0": logit if logits else tf.sigmoid(logit)}

    module.serve = serve
    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})
    return str(path)


@pytest.fixture(scope="module")
def taxi_like(tmp_path_factory):
    root = tmp_path_factory.mktemp("one_column")
    rng = np.random.default_rng(0)
    x = rng.normal(size=600).astype(np.float32)
    y = (x + rng.normal(scale=0.8, size=600) > 0.3).astype(np.int64)
    return {"root": root, "x": x[400:], "y": y[400:], "train": write_split(root / "train.gz", x[:400], y[:400]),
            "eval": write_split(root / "eval.gz", x[400:], y[400:])}


def evaluate(data, candidate: str, champion: str | None = None, answers=None, **keys):
    config = EvaluatorConfig(label_key=LABEL, compare_to_champion=champion is not None, **keys)
    return evaluate_and_decide(candidate, data["eval"], champion, config, train_pattern=data["train"],
                               candidate_answers=answers, describe=lambda path: describe_model(
                                   path, config.label_key, config.signature_name, data["eval"],
                                   config.preprocessing_function_names, config.binary, config.prediction_key))


@pytest.mark.parametrize("logits", [False, True], ids=["sigmoid", "logit"])
def test_one_column_is_a_binary_classifier_when_a_binary_metric_is_named(taxi_like, logits):
    model = one_column_model(taxi_like["root"] / f"model_{logits}", 2.0, -0.5, logits)
    p = 1 / (1 + np.exp(-(2.0 * taxi_like["x"] - 0.5)))
    y = taxi_like["y"]
    answers = []
    metrics = [TAXI_ACCURACY, *({"class_name": name} for name in ("AUC", "Precision", "Recall", "F1Score"))]
    decision = evaluate(taxi_like, model, metrics_specs=[{"metrics": metrics}],
                        answers=lambda answer, rows, candidate: answers.append(
                            signature_columns(answer, rows, candidate.heads, candidate.output_keys, candidate.logits)))
    figures = decision.candidate
    assert figures[f"{LABEL}_accuracy"] == pytest.approx(np.mean((p > 0.5) == y), abs=1e-9)
    assert figures[f"{LABEL}_loss"] == pytest.approx(log_loss(y, p), rel=1e-4)
    overall = decision.slices_json()["slices"][0]
    assert overall["slice"] == "Overall"
    assert overall["candidate"][f"{LABEL}_auc"] == pytest.approx(roc_auc_score(y, p), abs=2e-3)
    assert overall["candidate"][f"{LABEL}_precision"] == pytest.approx(precision_score(y, p > 0.5), abs=1e-9)
    assert overall["candidate"][f"{LABEL}_recall"] == pytest.approx(recall_score(y, p > 0.5), abs=1e-9)
    assert overall["candidate"][f"{LABEL}_f1_score"] == pytest.approx(f1_score(y, p > 0.5), abs=1e-9)
    assert overall["confusion"][LABEL]["matrix"] == [[int(np.sum((p <= 0.5) & (y == c))), int(np.sum((p > 0.5) & (y == c)))]
                                                    for c in (0, 1)]
    # The trivial floor is the train split's class priors, not a mean: its loss is a log loss.
    assert decision.trivial[f"{LABEL}_loss"] > 0.6
    # The predictions recorded for monitoring are classes, "1" where p > 0.5.
    predicted = [v.decode() for batch in answers for v in batch.column(LABEL).flatten().to_pylist()]
    assert predicted == ["1" if v > 0.5 else "0" for v in p]
    assert decision.blessed, decision.summary()
    assert any("tips_accuracy" in r and "in [0.6, inf]" in r for r in decision.reasons), decision.reasons


def test_the_reading_of_scores_is_decided_once_per_model(taxi_like, tmp_path):
    """A logit model's batch whose logits all fall in [0, 1] is still read as logits; a model read
    as probabilities on its first batch that answers a logit later is an error, not a mix."""
    rng = np.random.default_rng(1)
    spread, narrow = rng.normal(size=50).astype(np.float32), rng.uniform(0.25, 0.75, size=50).astype(np.float32)
    y = (rng.uniform(size=100) < 0.5).astype(np.int64)
    model = one_column_model(tmp_path / "logit", 2.0, -0.5, True)  # 2x - 0.5: in [0, 1] on the narrow rows
    binary = {"metrics_specs": [{"metrics": [{"class_name": "BinaryAccuracy"}]}], "batch_size": 50}
    x = np.concatenate([spread, narrow])
    data = {**taxi_like, "eval": write_split(tmp_path / "spread_first.gz", x, y)}
    p = 1 / (1 + np.exp(-(2.0 * x - 0.5)))
    answers = []
    decision = evaluate(data, model, answers=lambda answer, rows, candidate: answers.append(
        signature_columns(answer, rows, candidate.heads, candidate.output_keys, candidate.logits)), **binary)
    assert decision.candidate[f"{LABEL}_loss"] == pytest.approx(log_loss(y, p), rel=1e-4)
    assert decision.candidate[f"{LABEL}_accuracy"] == pytest.approx(np.mean((p > 0.5) == y), abs=1e-9)
    predicted = [v.decode() for batch in answers for v in batch.column(LABEL).flatten().to_pylist()]
    assert predicted == ["1" if v > 0.5 else "0" for v in p]  # a narrow row's logit 0.3 is class 1 (p 0.57), not 0
    data = {**taxi_like, "eval": write_split(tmp_path / "narrow_first.gz", np.concatenate([narrow, spread]), y)}
    with pytest.raises(ValueError, match="read as probabilities .* but batch 2 holds scores that are not"):
        evaluate(data, model, **binary)


def test_without_a_binary_metric_one_column_stays_a_regression(taxi_like):
    model = one_column_model(taxi_like["root"] / "regression", 2.0, -0.5, False)
    errors = [{"class_name": n} for n in ("MeanSquaredError", "MeanAbsolutePercentageError", "MeanSquaredLogarithmicError")]
    decision = evaluate(taxi_like, model, metrics_specs=[{"metrics": errors}])
    assert f"{LABEL}_rmse" in decision.candidate and f"{LABEL}_accuracy" not in decision.candidate
    y, p = taxi_like["y"], 1 / (1 + np.exp(-(2.0 * taxi_like["x"] - 0.5)))
    overall = decision.slices_json()["slices"][0]["candidate"]
    assert overall[f"{LABEL}_mse"] == pytest.approx(mean_squared_error(y, p), rel=1e-5)
    # TFMA's: a row labelled 0 has no percentage error, and is left out of the mean.
    assert overall[f"{LABEL}_mape"] == pytest.approx(100 * np.mean(np.abs(1 - p[y == 1])), rel=1e-5)
    assert overall[f"{LABEL}_msle"] == pytest.approx(np.mean((np.log1p(y) - np.log1p(p)) ** 2), rel=1e-4)
    from components.tfma_result import metric_key
    assert metric_key(f"{LABEL}_msle", [LABEL], "candidate").name == "mean_squared_logarithmic_error"
    assert f"{LABEL}_mape" not in evaluate(taxi_like, model).slices_json()["slices"][0]["candidate"]


def test_the_threshold_maps_and_output_names_of_a_metrics_spec(taxi_like):
    """TFMA's MetricsSpec.thresholds (overall) and per_slice_thresholds (on their slices, judged
    from min_slice_size examples) by TFMA's metric names, and output_names choosing the heads."""
    model = one_column_model(taxi_like["root"] / "maps", 2.0, -0.5, False)
    strict = {"value_threshold": {"lower_bound": 0.99}}
    metrics = [{"class_name": "BinaryAccuracy"}, {"class_name": "Precision"}]
    refused = evaluate(taxi_like, model, metrics_specs=[{"metrics": metrics, "thresholds": {"precision": strict}}])
    assert [f for f in refused.failed if f.startswith("slice Overall: tips_precision")], refused.failed
    assert not [f for f in refused.failed if "tips_accuracy" in f], refused.failed

    per_slice = {"binary_accuracy": {"thresholds": [{"slicing_specs": [{"feature_keys": [LABEL]}], "threshold": strict}]}}
    spec = {"metrics": metrics, "per_slice_thresholds": per_slice}
    sliced = {"metrics_specs": [spec], "slicing_specs": [{"feature_keys": [LABEL]}], "slice_guard": False}
    by_label = evaluate(taxi_like, model, min_slice_size=1, **sliced)
    assert sorted(f.split(":")[0] for f in by_label.failed) == ["slice tips=0", "slice tips=1"], by_label.failed
    assert evaluate(taxi_like, model, min_slice_size=10_000, **sliced).blessed  # reported, not gated
    with pytest.raises(ValidationError, match="is not within evaluator.slicing_specs"):
        EvaluatorConfig(metrics_specs=[spec])
    # As in TFMA, a metric's own threshold (no slicing spec) is on every evaluated slice.
    everywhere = {"metrics_specs": [{"metrics": [{"class_name": "BinaryAccuracy", "threshold": strict}]}],
                  "slicing_specs": [{"feature_keys": [LABEL]}], "slice_guard": False, "min_slice_size": 1}
    failed = evaluate(taxi_like, model, **everywhere).failed
    assert sorted(f.split(":")[0] for f in failed) == ["slice Overall", "slice tips=0", "slice tips=1"], failed
    # A threshold on one value's slice, within the evaluated specs; a value no eval row holds fails, as
    # TFMA's missing slices do.
    lenient = {"value_threshold": {"lower_bound": 0.0}}
    config = {"slicing_specs": [{"feature_keys": [LABEL]}], "slice_guard": False, "min_slice_size": 1}
    per_value = {"binary_accuracy": {"thresholds": [{"slicing_specs": [{"feature_values": {LABEL: "1"}}], "threshold": lenient}]}}
    assert evaluate(taxi_like, model, metrics_specs=[{"metrics": metrics, "per_slice_thresholds": per_value}], **config).blessed
    per_value["binary_accuracy"]["thresholds"][0]["slicing_specs"] = [{"feature_values": {LABEL: "7"}}]
    missing = evaluate(taxi_like, model, metrics_specs=[{"metrics": metrics, "per_slice_thresholds": per_value}], **config)
    assert any("no evaluated slice is of the threshold's slicing specs [{'feature_values': {'tips': '7'}}]" in f
               for f in missing.failed), missing.failed

    reached = evaluate(taxi_like, model, metrics_specs=[{"metrics": [{"class_name": "Precision", "threshold": strict}],
                                                         "output_names": [LABEL]}])
    assert [f for f in reached.failed if f.startswith("slice Overall: tips_precision")], reached.failed
    other = evaluate(taxi_like, model, metrics_specs=[{"metrics": [{"class_name": "Precision", "threshold": strict}],
                                                       "output_names": ["tip_amount"]}])
    assert any("tip_amount_Precision not computed for the candidate" in f for f in other.failed), other.failed
    with pytest.raises(ValidationError, match="thresholds: auc is not a metric of the spec's metrics; they are "
                                              "named binary_accuracy, precision"):
        EvaluatorConfig(metrics_specs=[{"metrics": metrics, "thresholds": {"auc": strict}}])


def test_metric_thresholds_gate_the_overall_figures_and_the_change_against_the_champion(taxi_like):
    good = one_column_model(taxi_like["root"] / "good", 2.0, -0.5, False)
    poor = one_column_model(taxi_like["root"] / "poor", 0.2, 0.4, False)
    specs = [{"metrics": [TAXI_ACCURACY]}]
    refused = evaluate(taxi_like, good, metrics_specs=[{"metrics": [
        {"class_name": "BinaryAccuracy", "threshold": {"value_threshold": {"lower_bound": 0.99}}}]}])
    assert not refused.blessed
    assert any(f.startswith("slice Overall: tips_accuracy") and "in [0.99, inf]" in f for f in refused.failed), refused.failed
    assert evaluate(taxi_like, good, poor, metrics_specs=specs).blessed
    worse = evaluate(taxi_like, poor, good, metrics_specs=specs, relative_tolerance=1.0, absolute_tolerance=1.0)
    assert not worse.blessed  # within the loss tolerance, but not TFMA's change threshold on accuracy
    assert [f for f in worse.failed if "vs champion" in f and "tips_accuracy" in f], worse.failed


def test_the_thresholds_are_in_tfma_s_eval_config():
    from components.tfma_result import eval_config

    config = EvaluatorConfig(metrics_specs=[{"metrics": [TAXI_ACCURACY]}])
    written = eval_config(config, True, {LABEL: "classification"})
    threshold = written.metrics_specs[0].per_slice_thresholds[f"{LABEL}_accuracy"].thresholds[0].threshold
    assert threshold.value_threshold.lower_bound.value == 0.6
    assert threshold.change_threshold.absolute.value == -1e-10
    per_slice = {"precision": {"thresholds": [{"slicing_specs": [{"feature_keys": ["x"]}],
                                               "threshold": {"value_threshold": {"lower_bound": 0.5}}}]}}
    config = EvaluatorConfig(slicing_specs=[{"feature_keys": ["x"]}], metrics_specs=[
        {"metrics": [{"class_name": "Precision"}], "per_slice_thresholds": per_slice}])
    [written] = eval_config(config, False, {LABEL: "classification"}).metrics_specs[0].per_slice_thresholds[
        f"{LABEL}_precision"].thresholds
    assert list(written.slicing_specs[0].feature_keys) == ["x"] and written.threshold.value_threshold.lower_bound.value == 0.5


def three_class_model(path) -> str:
    """`serving_default` answers softmax([2x, 0, -2x]) (classes 0, 1, 2) for serialized tf.Examples."""
    module = tf.Module()

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve(examples):
        x = tf.io.parse_example(examples, {"x": tf.io.FixedLenFeature([1], tf.float32)})["x"]
        return {"output_0": tf.nn.softmax(tf.concat([2.0 * x, tf.zeros_like(x), -2.0 * x], axis=1))}

    module.serve = serve
    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})
    return str(path)


def test_binarize_computes_each_class_against_the_rest(tmp_path):
    """TFMA's binarize.class_ids: a multi-class head's accuracy, precision, recall and AUC of each
    class one against the rest (its probability above 0.5), against scikit-learn's; thresholds
    apply to every class id, and the TFMA result keys them by class id."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=600).astype(np.float32)
    y = np.digitize(-x + rng.normal(scale=0.5, size=600), [-0.6, 0.6]).astype(np.int64)  # 0: high x, 2: low
    data = {"train": write_split(tmp_path / "train.gz", x[:400], y[:400]),
            "eval": write_split(tmp_path / "eval.gz", x[400:], y[400:])}
    model = three_class_model(tmp_path / "model")
    logits = np.stack([2.0 * x[400:], np.zeros(200), -2.0 * x[400:]], axis=1)
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    truth = y[400:]
    metrics = [{"class_name": name} for name in ("BinaryAccuracy", "Precision", "Recall", "AUC", "F1Score",
                                                 "AUCPrecisionRecall")]
    metrics.append({"class_name": "PrecisionAtRecall", "config": '{"recall": 0.5}'})
    strict = {"value_threshold": {"lower_bound": 0.99}}
    decision = evaluate(data, model, metrics_specs=[{"metrics": metrics, "binarize": {"class_ids": {"values": [0, 1]}},
                                                     "thresholds": {"recall": strict}}])
    overall = decision.slices_json()["slices"][0]["candidate"]
    for c in (0, 1):
        positive, predicted = truth == c, p[:, c] > 0.5
        assert overall[f"{LABEL}_accuracy_class_{c}"] == pytest.approx(np.mean(positive == predicted), abs=1e-9)
        assert overall[f"{LABEL}_recall_class_{c}"] == pytest.approx(recall_score(positive, predicted), abs=1e-9)
        assert overall[f"{LABEL}_auc_class_{c}"] == pytest.approx(roc_auc_score(positive, p[:, c]), abs=2e-3)
        assert overall[f"{LABEL}_f1_score_class_{c}"] == pytest.approx(f1_score(positive, predicted), abs=1e-9)
        assert overall[f"{LABEL}_auc_precision_recall_class_{c}"] == pytest.approx(
            average_precision_score(positive, p[:, c]), abs=0.02)
        rates = rates_at_auc_thresholds(positive, p[:, c])
        assert overall[f"{LABEL}_precision_at_recall_class_{c}"] == pytest.approx(
            np.nanmax(rates["precision"][rates["recall"] >= 0.5]), abs=1e-12)
    assert overall[f"{LABEL}_precision_class_0"] == pytest.approx(precision_score(truth == 0, p[:, 0] > 0.5), abs=1e-9)
    assert f"{LABEL}_recall_class_2" not in overall and f"{LABEL}_precision" not in overall
    # Class 1's probability never passes 0.5 (softmax of [2x, 0, -2x]): recall 0, refused by name;
    # its precision has no predicted positive to divide by (TFMA's NaN), so there is none.
    assert overall[f"{LABEL}_recall_class_1"] == 0.0 and f"{LABEL}_precision_class_1" not in overall
    assert [f for f in decision.failed if f.startswith(f"slice Overall: {LABEL}_recall_class_1")], decision.failed
    assert not decision.blessed

    from components.tfma_result import metric_key
    key = metric_key(f"{LABEL}_recall_class_1", [LABEL], "candidate")
    assert (key.name, key.output_name, key.sub_key.class_id.value) == ("recall", LABEL, 1)
    with pytest.raises(ValidationError, match="binarize: BinaryCrossentropy is not computed per class"):
        EvaluatorConfig(metrics_specs=[{"metrics": [{"class_name": "BinaryCrossentropy"}], "binarize": {"class_ids": {"values": [0]}}}])


def test_a_metric_of_another_head_kind_refuses_naming_it(taxi_like):
    model = one_column_model(taxi_like["root"] / "kinds", 2.0, -0.5, False)
    decision = evaluate(taxi_like, model, metrics_specs=[{"metrics": [
        {"class_name": "RootMeanSquaredError", "threshold": {"value_threshold": {"upper_bound": 1.0}}},
        {"class_name": "BinaryAccuracy"}]}])
    assert not decision.blessed
    assert any("tips_RootMeanSquaredError not computed for the candidate" in f for f in decision.failed), decision.failed


def test_a_metric_loopline_does_not_compute_is_refused_by_name():
    with pytest.raises(ValidationError, match="class_name 'MinLabelPosition' is not computed"):
        EvaluatorConfig(metrics_specs=[{"metrics": [{"class_name": "MinLabelPosition"}]}])
    with pytest.raises(ValidationError, match="binarize"):
        EvaluatorConfig(metrics_specs=[{"metrics": [], "binarize": {"top_k_list": [1]}}])


def test_metric_names_are_the_names_tfma_gives_its_metrics():
    """MetricsSpec's threshold maps are keyed by the names TFMA's own metric objects take: TFMA's
    registered class of that name, else tf.keras' (as TFMA resolves a class_name)."""
    import tf_keras
    from tensorflow_model_analysis import metrics as tfma_metrics

    from trainer.evaluator_config import OPERATING_POINT_METRICS, TFMA_METRICS, tfma_metric_name

    for class_name in TFMA_METRICS:
        point = {OPERATING_POINT_METRICS[class_name][0]: 0.5} if class_name in OPERATING_POINT_METRICS else {}
        metric = (getattr(tfma_metrics, class_name, None) or getattr(tf_keras.metrics, class_name))(**point)
        assert tfma_metric_name(class_name) == metric.name, class_name
    strict = {"value_threshold": {"lower_bound": 0.9}}
    spec = EvaluatorConfig(metrics_specs=[{"metrics": [{"class_name": "F1Score"}], "thresholds": {"f1_score": strict}}])
    assert list(spec.metrics_specs[0].thresholds) == ["f1_score"]


def test_confusion_figures_are_tfma_s_on_the_same_counts():
    """Every confusion-matrix metric the Evaluator takes: TFMA's own metric object of that class
    gives the same name and, from the same counts, the same value (NaN where loopline has none)."""
    import math

    from tensorflow_model_analysis import metrics as tfma_metrics

    from trainer.evaluator_config import CONFUSION_METRICS
    from trainer.slicing import CONFUSION_FIGURES, confusion_figures

    assert sorted(CONFUSION_METRICS.values()) == sorted(CONFUSION_FIGURES)
    counts = [(40.0, 7.0, 5.0, 48.0), (0.0, 0.0, 3.0, 9.0), (6.0, 2.0, 0.0, 0.0), (0.0, 0.0, 0.0, 0.0), (1.0, 0.0, 0.0, 0.0)]
    for class_name, figure in CONFUSION_METRICS.items():
        metric = getattr(tfma_metrics, class_name)()
        assert metric.name == figure, class_name
        for tp, fp, fn, tn in counts:
            theirs = metric.result(tp=tp, tn=tn, fp=fp, fn=fn)
            ours = confusion_figures(tp, fp, fn, tn, [figure]).get(figure)
            assert (ours is None) == math.isnan(theirs), (class_name, tp, fp, fn, tn, theirs, ours)
            assert ours is None or ours == pytest.approx(theirs, abs=1e-12), (class_name, tp, fp, fn, tn)


def test_confusion_metrics_named_in_a_spec_are_computed_and_gated(taxi_like):
    """Specificity and Matthews' correlation of a one-column model, per slice, as scikit-learn's;
    a FallOut threshold refuses; a confusion metric no spec names is not in the slices."""
    from trainer.metric_direction import higher_is_better

    model = one_column_model(taxi_like["root"] / "confusion", 2.0, -0.5, False)
    y, predicted = taxi_like["y"], 1 / (1 + np.exp(-(2.0 * taxi_like["x"] - 0.5))) > 0.5
    strict = {"value_threshold": {"upper_bound": 0.01}}
    names = ("Specificity", "MatthewsCorrelationCoefficient", "FallOut", "FalseNegatives")
    decision = evaluate(taxi_like, model, metrics_specs=[{"metrics": [{"class_name": n} for n in names],
                                                          "thresholds": {"fall_out": strict}}])
    overall = decision.slices_json()["slices"][0]["candidate"]
    assert overall[f"{LABEL}_specificity"] == pytest.approx(recall_score(y, predicted, pos_label=0), abs=1e-9)
    assert overall[f"{LABEL}_matthews_correlation_coefficient"] == pytest.approx(matthews_corrcoef(y, predicted), abs=1e-9)
    assert overall[f"{LABEL}_fall_out"] == pytest.approx(1 - overall[f"{LABEL}_specificity"], abs=1e-9)
    assert overall[f"{LABEL}_false_negatives"] == np.sum(~predicted & (y == 1))
    assert f"{LABEL}_miss_rate" not in overall and f"{LABEL}_precision" in overall
    assert overall[f"{LABEL}_fall_out"] > 0.01
    assert [f for f in decision.failed if f.startswith(f"slice Overall: {LABEL}_fall_out")], decision.failed
    # The one direction rule reads these names as TFMA's metrics move when a model improves.
    assert all(higher_is_better(f"{LABEL}_{n}") for n in ("specificity", "negative_predictive_value", "threat_score",
                                                         "balanced_accuracy", "matthews_correlation_coefficient",
                                                         "true_positives", "true_negatives", "f1_score"))
    assert not any(higher_is_better(f"{LABEL}_{n}") for n in ("fall_out", "miss_rate", "false_discovery_rate",
                                                             "false_omission_rate", "false_positives", "false_negatives"))


def test_tfma_means_of_a_binary_head_and_of_a_regression(taxi_like):
    """MeanLabel, MeanPrediction and Calibration per slice, where a spec names them: class 1's
    label and probability for a binary head, the label and prediction for a regression."""
    x, y = taxi_like["x"], taxi_like["y"]
    p = 1 / (1 + np.exp(-(2.0 * x - 0.5)))
    means = [{"class_name": name} for name in ("MeanLabel", "MeanPrediction", "Calibration")]
    model = one_column_model(taxi_like["root"] / "means", 2.0, -0.5, False)
    for binary in (True, False):
        metrics = means + ([{"class_name": "BinaryAccuracy"}] if binary else [])
        overall = evaluate(taxi_like, model, metrics_specs=[{"metrics": metrics}]).slices_json()["slices"][0]["candidate"]
        assert (f"{LABEL}_accuracy" in overall) is binary
        assert overall[f"{LABEL}_mean_label"] == pytest.approx(np.mean(y), abs=1e-9)
        assert overall[f"{LABEL}_mean_prediction"] == pytest.approx(np.mean(p), rel=1e-5)
        assert overall[f"{LABEL}_calibration"] == pytest.approx(np.sum(p) / np.sum(y), rel=1e-5)
    plain = evaluate(taxi_like, model, metrics_specs=[{"metrics": [{"class_name": "BinaryAccuracy"}]}])
    assert f"{LABEL}_mean_label" not in plain.slices_json()["slices"][0]["candidate"]
    with pytest.raises(ValidationError, match="binarize: MeanLabel is not computed per class"):
        EvaluatorConfig(metrics_specs=[{"metrics": [{"class_name": "MeanLabel"}], "binarize": {"class_ids": {"values": [0]}}}])


def test_the_precision_recall_auc_is_tfma_s(taxi_like):
    """AUCPrecisionRecall of a one-column model: Keras' PR AUC on the same thresholds (the Evaluator's
    1,000 buckets), and TFMA's own interpolation on the Evaluator's counts at those thresholds."""
    import tf_keras
    from tensorflow_model_analysis import metrics as tfma_metrics
    from tensorflow_model_analysis.metrics.binary_confusion_matrices import Matrices

    from trainer.slicing import AUC_BUCKETS, pr_auc, roc_auc, threshold_counts

    model = one_column_model(taxi_like["root"] / "pr_auc", 2.0, -0.5, False)
    y, p = taxi_like["y"], 1 / (1 + np.exp(-(2.0 * taxi_like["x"] - 0.5)))
    decision = evaluate(taxi_like, model, metrics_specs=[{"metrics": [{"class_name": "AUCPrecisionRecall"}]}])
    figure = decision.slices_json()["slices"][0]["candidate"][f"{LABEL}_auc_precision_recall"]
    keras_pr = tf_keras.metrics.AUC(num_thresholds=AUC_BUCKETS + 1, curve="PR")
    keras_pr.update_state(y, p.astype(np.float32))
    assert figure == pytest.approx(float(keras_pr.result()), abs=1e-4)

    buckets = np.ceil(p * AUC_BUCKETS).astype(int)
    negatives = np.bincount(buckets[y == 0], minlength=AUC_BUCKETS + 1).astype(float)
    positives = np.bincount(buckets[y == 1], minlength=AUC_BUCKETS + 1).astype(float)
    tp, fp, fn, tn = threshold_counts(negatives, positives)
    thresholds = [-1e-7, *(np.arange(1, AUC_BUCKETS) / AUC_BUCKETS), 1 + 1e-7]
    matrices = Matrices(thresholds=thresholds, tp=list(tp), tn=list(tn), fp=list(fp), fn=list(fn))
    tfma_auc = tfma_metrics.AUC()
    for curve, ours in (("PR", pr_auc(negatives, positives)), ("ROC", roc_auc(negatives, positives))):
        theirs = tfma_auc._metric_value(curve=curve, summation_method="interpolation", key=None, matrices=matrices)
        assert ours == pytest.approx(theirs, abs=1e-12), curve
    assert pr_auc(negatives, np.zeros_like(positives)) is None


def test_tfma_s_plots_are_accepted_and_the_confusion_matrix_plot_is_tfma_s(taxi_like, tmp_path):
    """TFMA's binary classification config names ConfusionMatrixPlot and CalibrationPlot: accepted
    (a threshold on a plot refused). The ConfusionMatrixPlot written per slice is what TFMA's own
    Matrices.to_proto makes of the counts at TFMA's 1,002 thresholds, the counts those of the model's
    probabilities (p > threshold), in one unnamed plot with the calibration histogram as TFMA's writer
    combines them, which tfma.load_eval_result shows; unnamed, it is not written."""
    import tensorflow_model_analysis as tfma
    from tensorflow_model_analysis.metrics.binary_confusion_matrices import Matrices
    from tensorflow_model_analysis.proto import metrics_for_slice_pb2

    from components.evaluator import write_slices
    from trainer.slicing import PLOT_THRESHOLDS, TFMA_FOLDER

    model = one_column_model(taxi_like["root"] / "plots", 2.0, -0.5, False)
    y, p = taxi_like["y"], (1 / (1 + np.exp(-(2.0 * taxi_like["x"] - 0.5)))).astype(np.float32)
    named = ["ExampleCount", "BinaryAccuracy", "ConfusionMatrixPlot", "CalibrationPlot", "MultiClassConfusionMatrixPlot"]
    plots, shown = {}, {}
    for case, names in (("named", named), ("unnamed", named[:2])):
        (tmp_path / case).mkdir()
        keys = {"metrics_specs": [{"metrics": [{"class_name": name} for name in names]}]}
        decision = evaluate(taxi_like, model, **keys)
        assert decision.blessed, decision.summary()
        write_slices(str(tmp_path / case), decision, EvaluatorConfig(label_key=LABEL, **keys), [LABEL], model,
                     taxi_like["eval"])
        folder = tmp_path / case / TFMA_FOLDER
        [record] = tf.data.TFRecordDataset(str(folder / "plots-00000-of-00001.tfrecord")).as_numpy_iterator()
        plots[case] = {kv.key.name: kv.value for kv in metrics_for_slice_pb2.PlotsForSlice.FromString(record)
                       .plot_keys_and_values}
        shown[case] = dict(tfma.load_eval_result(str(folder)).plots)[()][LABEL][""]
    assert set(plots["named"]) == set(plots["unnamed"]) == {"multi_class_confusion_matrix_plot", ""}
    assert not plots["unnamed"][""].HasField("confusion_matrix_at_thresholds")
    assert set(shown["named"]) == {"confusionMatrixAtThresholds", "calibrationHistogramBuckets"}
    assert set(shown["unnamed"]) == {"calibrationHistogramBuckets"}

    thresholds = PLOT_THRESHOLDS.tolist()
    assert len(thresholds) == 1002 and thresholds[:3] == [-1e-6, 0.0, 0.001] and thresholds[-1] == 1.0
    above = p[None, :] > np.asarray(thresholds, np.float32)[:, None]
    tp, fp = (above & (y == 1)).sum(1).astype(float), (above & (y == 0)).sum(1).astype(float)
    fn, tn = (y == 1).sum() - tp, (y == 0).sum() - fp
    theirs = Matrices(thresholds=thresholds, tp=tp.tolist(), tn=tn.tolist(), fp=fp.tolist(), fn=fn.tolist()).to_proto()
    ours = plots["named"][""].confusion_matrix_at_thresholds.matrices
    assert len(ours) == 1002 and 0 < tp[500] < tp[1]
    for mine, tfma_s in zip(ours, theirs.confusion_matrix_at_thresholds.matrices):
        for field in ("threshold", "true_positives", "false_positives", "true_negatives", "false_negatives",
                      "precision", "recall", "f1", "accuracy", "false_positive_rate"):
            assert getattr(mine, field) == pytest.approx(getattr(tfma_s, field), abs=1e-9), (tfma_s.threshold, field)
        assert (np.isnan(mine.false_omission_rate) and np.isnan(tfma_s.false_omission_rate)) or \
            mine.false_omission_rate == pytest.approx(tfma_s.false_omission_rate, abs=1e-9)

    with pytest.raises(ValidationError, match="a plot has no value to gate"):
        EvaluatorConfig(metrics_specs=[{"metrics": [{"class_name": "ConfusionMatrixPlot", "threshold": {
            "value_threshold": {"lower_bound": 0.5}}}]}])
    with pytest.raises(ValidationError, match="confusion_matrix_plot is not a metric of the spec's metrics"):
        EvaluatorConfig(metrics_specs=[{"metrics": [{"class_name": "ConfusionMatrixPlot"}], "thresholds": {
            "confusion_matrix_plot": {"value_threshold": {"lower_bound": 0.5}}}}])


def test_weighted_example_count_is_the_example_count_without_example_weights(taxi_like):
    """Example weights are not taken (every row weighs 1), so TFMA's WeightedExampleCount is the
    example count: a threshold on it gates `<head>_examples`."""
    model = one_column_model(taxi_like["root"] / "weighted", 2.0, -0.5, False)
    rows = len(taxi_like["y"])
    for bound, blessed in ((rows, True), (rows + 1, False)):
        spec = {"metrics": [{"class_name": "BinaryAccuracy"}, {"class_name": "WeightedExampleCount"}],
                "thresholds": {"weighted_example_count": {"value_threshold": {"lower_bound": bound}}}}
        decision = evaluate(taxi_like, model, metrics_specs=[spec])
        assert decision.blessed is blessed, decision.summary()
    assert [reason for reason in decision.failed if f"{LABEL}_examples {rows}" in reason], decision.failed


def tfma_default_specs(name: str) -> list[dict]:
    """TFMA's default metrics specs as its protos serialize them (each metric's config as JSON text,
    Keras' module paths, example_weights), as keys."""
    import tensorflow_model_analysis as tfma
    from google.protobuf import json_format

    specs = getattr(tfma.metrics, f"default_{name}_specs")()
    return [json_format.MessageToDict(spec, preserving_proto_field_name=True) for spec in specs]


def test_tfma_s_default_binary_specs_as_serialized_run_and_their_names_key_the_thresholds(taxi_like):
    """tfma.metrics.default_binary_classification_specs() as TFMA serializes it runs unchanged: the
    configs' names key the threshold maps (its PR AUC is `auc_precison_recall`, its cross-entropy
    `loss`), AUC's curve PR is the precision-recall AUC, and settings loopline does not compute are
    refused by name."""
    from trainer.slicing import pr_auc, AUC_BUCKETS

    model = one_column_model(taxi_like["root"] / "default_specs", 2.0, -0.5, False)
    y, p = taxi_like["y"], 1 / (1 + np.exp(-(2.0 * taxi_like["x"] - 0.5)))
    buckets = np.ceil(p * AUC_BUCKETS).astype(int)
    expected_pr = pr_auc(*(np.bincount(buckets[y == c], minlength=AUC_BUCKETS + 1).astype(float) for c in (0, 1)))
    specs = tfma_default_specs("binary_classification")
    assert any("config" in m and "curve" in m["config"] for s in specs for m in s["metrics"])  # as serialized
    plain = evaluate(taxi_like, model, metrics_specs=specs)
    assert plain.blessed, plain.summary()
    overall = plain.slices_json()["slices"][0]["candidate"]
    assert overall[f"{LABEL}_auc_precision_recall"] == pytest.approx(expected_pr, abs=1e-9)
    assert overall[f"{LABEL}_accuracy"] == pytest.approx(np.mean((p > 0.5) == y), abs=1e-9)
    assert overall[f"{LABEL}_mean_label"] == pytest.approx(np.mean(y), abs=1e-9)

    for name, figure, value in (("auc_precison_recall", "auc_precision_recall", expected_pr),
                                ("loss", "loss", log_loss(y, p))):
        for margin, blessed in ((-0.01, True), (0.01, False)):
            gated = [{**spec, "thresholds": {name: {"value_threshold": {"lower_bound": value + margin}}}}
                     if any(m["config"].find(f'"name": "{name}"') >= 0 for m in spec["metrics"]) else spec
                     for spec in specs]
            decision = evaluate(taxi_like, model, metrics_specs=gated)
            assert decision.blessed is blessed, (name, decision.summary())
        assert [f for f in decision.failed if f.startswith(f"slice Overall: {LABEL}_{figure}")], decision.failed

    with pytest.raises(ValidationError, match="config num_thresholds=1 is not computed.*an integer above 1 or null"):
        EvaluatorConfig(metrics_specs=[{"metrics": [{"class_name": "AUC", "config": '{"num_thresholds": 1}'}]}])
    with pytest.raises(ValidationError, match="config summation_method=\"minoring\" is not computed"):
        EvaluatorConfig(metrics_specs=[{"metrics": [{"class_name": "AUC", "config": {"summation_method": "minoring"}}]}])
    with pytest.raises(ValidationError, match="config threshold=0.7 is not computed"):
        EvaluatorConfig(metrics_specs=[{"metrics": [{"class_name": "BinaryAccuracy", "config": {"threshold": 0.7}}]}])
    with pytest.raises(ValidationError, match="module 'my_metrics' is a custom metric"):
        EvaluatorConfig(metrics_specs=[{"metrics": [{"class_name": "AUC", "module": "my_metrics"}]}])
    with pytest.raises(ValidationError, match="config is not JSON"):
        EvaluatorConfig(metrics_specs=[{"metrics": [{"class_name": "AUC", "config": '{"curve": "PR"'}]}])


def test_tfma_s_default_regression_specs_as_serialized_run(taxi_like):
    """default_regression_specs(): its MeanSquaredError is named `mse`, which keys its threshold."""
    model = one_column_model(taxi_like["root"] / "default_regression", 0.3, 0.2, False)
    p, y = 1 / (1 + np.exp(-(0.3 * taxi_like["x"] + 0.2))), taxi_like["y"]
    mse = mean_squared_error(y, p)
    specs = tfma_default_specs("regression")
    for margin, blessed in ((0.01, True), (-0.01, False)):
        gated = [{**spec, "thresholds": {"mse": {"value_threshold": {"upper_bound": mse + margin}}}}
                 if any('"name": "mse"' in m["config"] for m in spec["metrics"]) else spec for spec in specs]
        decision = evaluate(taxi_like, model, metrics_specs=gated, trivial_confidence=0, trivial_margin=0)
        overall = decision.slices_json()["slices"][0]["candidate"]
        assert overall[f"{LABEL}_mse"] == pytest.approx(mse, rel=1e-5)
        assert not [f for f in decision.failed if f"{LABEL}_mse" in f] if blessed else \
            [f for f in decision.failed if f.startswith(f"slice Overall: {LABEL}_mse")], decision.failed


def rates_at_auc_thresholds(positive: np.ndarray, p: np.ndarray) -> dict[str, np.ndarray]:
    """Precision, recall and specificity at the AUC's thresholds (-eps, 1/n .. (n-1)/n, 1 + eps),
    counted row by row: a row is predicted positive when p is above the threshold."""
    from trainer.slicing import AUC_BUCKETS

    thresholds = np.array([-1e-7, *(np.arange(1, AUC_BUCKETS) / AUC_BUCKETS), 1 + 1e-7])
    predicted = p[None, :] > thresholds[:, None]
    tp, fp = (predicted & positive).sum(1), (predicted & ~positive).sum(1)
    fn, tn = positive.sum() - tp, (~positive).sum() - fp
    with np.errstate(divide="ignore", invalid="ignore"):
        return {"precision": tp / (tp + fp), "recall": tp / (tp + fn), "specificity": tn / (tn + fp)}


def test_tfma_s_operating_point_metrics_are_tfma_s_on_the_same_counts(taxi_like, tmp_path):
    """PrecisionAtRecall, RecallAtPrecision, SensitivityAtSpecificity and SpecificityAtSensitivity,
    their point in the config as TFMA serializes it: each is TFMA's own _metric_value on the
    Evaluator's counts at the AUC's thresholds, and a brute force over those thresholds on the
    model's probabilities; the config's name names the figure and keys its threshold; per class
    under binarize."""
    from tensorflow_model_analysis import metrics as tfma_metrics
    from tensorflow_model_analysis.metrics.binary_confusion_matrices import Matrices

    from trainer.evaluator_config import OPERATING_POINT_METRICS
    from trainer.slicing import AUC_BUCKETS, threshold_counts

    model = one_column_model(taxi_like["root"] / "operating_points", 2.0, -0.5, False)
    y, p = taxi_like["y"], 1 / (1 + np.exp(-(2.0 * taxi_like["x"] - 0.5)))
    buckets = np.ceil(p * AUC_BUCKETS).astype(int)
    counts = threshold_counts(*(np.bincount(buckets[y == c], minlength=AUC_BUCKETS + 1).astype(float) for c in (0, 1)))
    thresholds = [-1e-7, *(np.arange(1, AUC_BUCKETS) / AUC_BUCKETS), 1 + 1e-7]
    matrices = Matrices(thresholds=thresholds, **dict(zip(("tp", "fp", "fn", "tn"), map(list, counts))))
    rates = rates_at_auc_thresholds(y == 1, p)

    at = 0.8
    metrics = [{"class_name": name, "config": f'{{"name": "{name.lower()}", "{key}": {at}}}'}
               for name, (key, _, _) in OPERATING_POINT_METRICS.items()]
    overall = evaluate(taxi_like, model, metrics_specs=[{"metrics": metrics}]).slices_json()["slices"][0]["candidate"]
    for name, (key, best, given) in OPERATING_POINT_METRICS.items():
        theirs = getattr(tfma_metrics, name)(**{key: at})._metric_value(**{key: at}, key=None, matrices=matrices)
        brute = np.nanmax(rates[best][rates[given] >= at])
        assert overall[f"{LABEL}_{name.lower()}"] == pytest.approx(theirs, abs=1e-12) == pytest.approx(brute, abs=1e-12), name
    assert 0 < overall[f"{LABEL}_precisionatrecall"] < 1

    value = overall[f"{LABEL}_precisionatrecall"]
    for margin, blessed in ((-0.01, True), (0.01, False)):
        spec = {"metrics": metrics, "thresholds": {"precisionatrecall": {"value_threshold": {"lower_bound": value + margin}}}}
        decision = evaluate(taxi_like, model, metrics_specs=[spec])
        assert decision.blessed is blessed, decision.summary()
    assert [f for f in decision.failed if f.startswith(f"slice Overall: {LABEL}_precisionatrecall")], decision.failed

    for bad, message in (({"recall": 1.5}, "config needs its recall, one number in \\[0, 1\\]"),
                         ({"recall": [0.5, 0.8]}, "config needs its recall"), ({}, "got null"),
                         ({"recall": 0.5, "class_id": 1}, "config class_id=1 is not computed")):
        with pytest.raises(ValidationError, match=message):
            EvaluatorConfig(metrics_specs=[{"metrics": [{"class_name": "PrecisionAtRecall", "config": bad}]}])
    binarized = EvaluatorConfig(metrics_specs=[{"metrics": [metrics[0]], "binarize": {"class_ids": {"values": [0, 2]}}}])
    assert [f for s in binarized.metrics_specs for m in s.metrics for f in s.figures(m, "species", "classification")] == [
        "species_precisionatrecall_class_0", "species_precisionatrecall_class_2"]


def test_keras_metrics_through_tfma_s_specs_from_metrics_run(taxi_like):
    """tfma.metrics.specs_from_metrics over tf.keras metrics, as TFX's examples build their specs:
    TFMA writes Keras' AUC with its 200 thresholds, which loopline computes over its own 1,001 (the
    same figure as an AUC named without config), and the metrics' names key their thresholds."""
    import json

    import tensorflow_model_analysis as tfma
    import tf_keras
    from google.protobuf import json_format

    model = one_column_model(taxi_like["root"] / "keras_metrics", 2.0, -0.5, False)
    specs = tfma.metrics.specs_from_metrics([tf_keras.metrics.AUC(name="auc_roc"), tf_keras.metrics.Precision(),
                                             tf_keras.metrics.BinaryAccuracy(name="accuracy")])
    specs = [json_format.MessageToDict(spec, preserving_proto_field_name=True) for spec in specs]
    assert [json.loads(m["config"])["num_thresholds"] for s in specs for m in s["metrics"] if m["class_name"] == "AUC"] == [200]
    plain = evaluate(taxi_like, model, metrics_specs=[{"metrics": [{"class_name": "AUC"}, {"class_name": "BinaryAccuracy"}]}])
    auc = plain.slices_json()["slices"][0]["candidate"][f"{LABEL}_auc"]
    specs[-1]["thresholds"] = {"auc_roc": {"value_threshold": {"lower_bound": auc + 1e-6}}}
    decision = evaluate(taxi_like, model, metrics_specs=specs)
    assert decision.slices_json()["slices"][0]["candidate"][f"{LABEL}_auc"] == auc
    assert [f for f in decision.failed if f.startswith(f"slice Overall: {LABEL}_auc")], decision.failed
    specs[-1]["thresholds"] = {"auc_roc": {"value_threshold": {"lower_bound": auc - 1e-6}}}
    assert evaluate(taxi_like, model, metrics_specs=specs).blessed


def tfma_calibration_buckets(y: np.ndarray, p: np.ndarray):
    """TFMA's own CalibrationPlot of these rows: its calibration histogram (10,000 buckets, its
    bucket index), rebinned to the plot's 1,000 and made a proto by calibration_plot._to_proto."""
    from tensorflow_model_analysis.metrics import calibration_histogram as histograms
    from tensorflow_model_analysis.metrics.calibration_plot import _to_proto

    combiner = histograms._CalibrationHistogramCombiner(
        key=None, eval_config=None, aggregation_type=None, class_weights=None, example_weighted=False,
        num_buckets=histograms.DEFAULT_NUM_BUCKETS, left=0.0, right=1.0, prediction_based_bucketing=True,
        fractional_labels=True)
    totals: dict[int, list[float]] = {}
    for label, prediction in zip(y.tolist(), p.tolist()):
        bucket = totals.setdefault(combiner._bucket_index(prediction), [0.0, 0.0, 0.0])
        bucket[0], bucket[1], bucket[2] = bucket[0] + label, bucket[1] + prediction, bucket[2] + 1
    histogram = [histograms.Bucket(i, *totals[i]) for i in sorted(totals)]
    thresholds = [float("-inf")] + [0.0 + i * 1.0 / 1000 for i in range(1001)]
    return _to_proto(thresholds, histograms.rebin(thresholds, histogram)).buckets


def test_a_named_calibration_plot_is_tfma_s_on_every_slice(taxi_like, tmp_path):
    """With CalibrationPlot named, each binary head's calibration histogram is written on every slice
    in TFMA's 1,002 buckets, as TFMA's own histogram, rebinning and _to_proto make them of the same
    probabilities; unnamed, the Overall slice's 10 bins are written, as before."""
    from tensorflow_model_analysis.proto import metrics_for_slice_pb2

    from components.evaluator import write_slices
    from trainer.slicing import TFMA_FOLDER

    model = one_column_model(taxi_like["root"] / "calibration", 2.0, -0.5, False)
    y, p = taxi_like["y"], (1 / (1 + np.exp(-(2.0 * taxi_like["x"] - 0.5)))).astype(np.float32)
    written = {}
    for case, names in (("named", ["BinaryAccuracy", "CalibrationPlot"]), ("unnamed", ["BinaryAccuracy"])):
        keys = {"metrics_specs": [{"metrics": [{"class_name": name} for name in names]}],
                "slicing_specs": [{"feature_keys": [LABEL]}], "slice_guard": False}
        decision = evaluate(taxi_like, model, **keys)
        (tmp_path / case).mkdir()
        write_slices(str(tmp_path / case), decision, EvaluatorConfig(label_key=LABEL, **keys), [LABEL], model,
                     taxi_like["eval"])
        records = tf.data.TFRecordDataset(str(tmp_path / case / TFMA_FOLDER / "plots-00000-of-00001.tfrecord"))
        for record in records.as_numpy_iterator():
            plots = metrics_for_slice_pb2.PlotsForSlice.FromString(record)
            name = ",".join(f"{k.column}={k.int64_value}" for k in plots.slice_key.single_slice_keys) or "Overall"
            written[case, name] = {kv.key.name: kv.value for kv in plots.plot_keys_and_values}
    assert 0 < len(written["unnamed", "Overall"][""].calibration_histogram_buckets.buckets) <= 10  # loopline's bins
    assert not written["unnamed", f"{LABEL}=1"].get("", metrics_for_slice_pb2.PlotData()).HasField(
        "calibration_histogram_buckets")
    for name, rows in (("Overall", slice(None)), (f"{LABEL}=0", y == 0), (f"{LABEL}=1", y == 1)):
        ours = written["named", name][""].calibration_histogram_buckets.buckets
        theirs = tfma_calibration_buckets(y[rows], p[rows])
        assert len(ours) == len(theirs) == 1002, name
        for mine, tfma_s in zip(ours, theirs):
            assert (mine.lower_threshold_inclusive, mine.upper_threshold_exclusive) == (
                tfma_s.lower_threshold_inclusive, tfma_s.upper_threshold_exclusive)
            assert mine.num_weighted_examples.value == tfma_s.num_weighted_examples.value, (name, tfma_s)
            assert mine.total_weighted_label.value == tfma_s.total_weighted_label.value, (name, tfma_s)
            assert mine.total_weighted_refined_prediction.value == pytest.approx(  # float32's last digits:
                tfma_s.total_weighted_refined_prediction.value, rel=1e-6)          # TF's sigmoid, NumPy's here
        assert sum(b.num_weighted_examples.value for b in ours) == len(y[rows]) > 0


def test_the_prediction_among_several_outputs_is_tfma_s(taxi_like):
    """A signature answering several outputs, as an estimator's or a classify signature's does: TFMA's
    ModelSpec.prediction_key names the one that predicts the label (evaluator.prediction_key); without
    it, the first of TFMA's common keys the signature answers (here `logistic` before `logits`); with
    neither, the Evaluator says which key to set."""
    def several(logit):
        return {"logits": logit, "logistic": tf.sigmoid(logit), "rank": -logit}

    single = one_column_model(taxi_like["root"] / "single", 2.0, -0.5, False)
    model = one_column_model(taxi_like["root"] / "several", 2.0, -0.5, False, outputs=several)
    binary = {"metrics_specs": [{"metrics": [{"class_name": "BinaryAccuracy"}, {"class_name": "AUC"}]}]}
    expected = evaluate(taxi_like, single, **binary).slices_json()["slices"][0]["candidate"]
    assert 0.6 < expected[f"{LABEL}_accuracy"] < 1
    for keys in ({}, {"prediction_key": "logistic"}):
        overall = evaluate(taxi_like, model, **binary, **keys).slices_json()["slices"][0]["candidate"]
        assert overall == expected, keys
    flipped = evaluate(taxi_like, model, **binary, prediction_key="rank").slices_json()["slices"][0]["candidate"]
    assert flipped[f"{LABEL}_auc"] == pytest.approx(1 - expected[f"{LABEL}_auc"], abs=2e-3)  # the outputs' own

    unknown = one_column_model(taxi_like["root"] / "unknown", 2.0, -0.5, False,
                               outputs=lambda logit: {"a": tf.sigmoid(logit), "b": logit})
    with pytest.raises(ValueError, match="none of them one of TFMA's prediction keys .*set evaluator.prediction_key"):
        evaluate(taxi_like, unknown, **binary)
    with pytest.raises(ValueError, match="evaluator.prediction_key 'c' is not one of its outputs"):
        evaluate(taxi_like, unknown, **binary, prediction_key="c")
    assert evaluate(taxi_like, unknown, **binary, prediction_key="a").slices_json()["slices"][0]["candidate"] == expected


def test_tfma_s_default_multi_class_specs_micro_average_every_pair(tmp_path):
    """tfma.metrics.default_multi_class_classification_specs() as serialized runs unchanged: its
    aggregate spec (micro_average) computes each binary metric over every (row, class) pair of the
    three-class head, the class's probability against whether the row is of it, as TFMA flattens
    them: accuracy, precision and recall against scikit-learn's on the pairs, the cross-entropy
    against Keras' BinaryCrossentropy on them, the means against NumPy's; thresholds by the
    configs' names gate them; TFMA's result keys them micro-averaged, and the named plots are of the
    pairs. Macro averages are refused by name."""
    import tf_keras
    from tensorflow_model_analysis.proto import metrics_for_slice_pb2

    from components.evaluator import write_slices
    from components.tfma_result import metric_key
    from trainer.slicing import TFMA_FOLDER

    rng = np.random.default_rng(3)
    x = rng.normal(size=600).astype(np.float32)
    y = np.digitize(-x + rng.normal(scale=0.5, size=600), [-0.6, 0.6]).astype(np.int64)
    data = {"train": write_split(tmp_path / "train.gz", x[:400], y[:400]),
            "eval": write_split(tmp_path / "eval.gz", x[400:], y[400:])}
    model = three_class_model(tmp_path / "model")
    logits = np.stack([2.0 * x[400:], np.zeros(200), -2.0 * x[400:]], axis=1)
    p = (np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)).astype(np.float32)
    labels = np.eye(3)[y[400:]]
    pairs, truth = p.ravel(), labels.ravel().astype(bool)

    specs = tfma_default_specs("multi_class_classification")
    assert any(spec.get("aggregate") == {"micro_average": True} for spec in specs)
    decision = evaluate(data, model, metrics_specs=specs)
    overall = decision.slices_json()["slices"][0]["candidate"]
    micro = {name[len(LABEL) + 1:-len("_micro_average")]: value for name, value in overall.items()
             if name.endswith("_micro_average")}
    assert micro["accuracy"] == pytest.approx(np.mean((pairs > 0.5) == truth), abs=1e-9)
    assert micro["precision"] == pytest.approx(precision_score(truth, pairs > 0.5), abs=1e-9)
    assert micro["recall"] == pytest.approx(recall_score(truth, pairs > 0.5), abs=1e-9)
    assert micro["auc"] == pytest.approx(roc_auc_score(truth, pairs), abs=2e-3)
    assert micro["auc_precision_recall"] == pytest.approx(average_precision_score(truth, pairs), abs=0.02)
    keras_loss = tf_keras.metrics.BinaryCrossentropy()
    keras_loss.update_state(labels.reshape(-1, 1), p.reshape(-1, 1))
    assert micro["loss"] == pytest.approx(float(keras_loss.result()), rel=1e-5)
    assert micro["mean_label"] == pytest.approx(1 / 3, abs=1e-9)
    assert micro["mean_prediction"] == pytest.approx(np.mean(pairs), rel=1e-5)
    assert micro["calibration"] == pytest.approx(np.sum(pairs) / np.sum(truth), rel=1e-5)
    assert overall[f"{LABEL}_accuracy"] == pytest.approx(np.mean(p.argmax(1) == y[400:]), abs=1e-9)  # not the pairs'

    aggregate = next(i for i, spec in enumerate(specs) if "aggregate" in spec)
    for margin, blessed in ((-0.01, True), (0.01, False)):
        gated = [dict(spec) for spec in specs]
        gated[aggregate]["thresholds"] = {"auc_precison_recall": {"value_threshold": {
            "lower_bound": micro["auc_precision_recall"] + margin}}}
        assert evaluate(data, model, metrics_specs=gated).blessed is blessed

    write_slices(str(tmp_path), decision, EvaluatorConfig(label_key=LABEL, metrics_specs=specs), [LABEL], model,
                 data["eval"])
    [record] = tf.data.TFRecordDataset(str(tmp_path / TFMA_FOLDER / "plots-00000-of-00001.tfrecord")).as_numpy_iterator()
    plots = {kv.key.name: kv.value for kv in metrics_for_slice_pb2.PlotsForSlice.FromString(record).plot_keys_and_values}
    matrices = plots[""].confusion_matrix_at_thresholds.matrices
    assert (matrices[1].threshold, matrices[1].true_positives, matrices[1].false_positives) == (0.0, 200, 400)
    assert matrices[501].true_positives == np.sum((pairs > 0.5) & truth)
    buckets = plots[""].calibration_histogram_buckets.buckets
    assert len(buckets) == 1002 and sum(b.num_weighted_examples.value for b in buckets) == 600
    assert sum(b.total_weighted_label.value for b in buckets) == 200
    key = metric_key(f"{LABEL}_recall_micro_average", [LABEL], "candidate")
    assert (key.name, key.output_name, key.aggregation_type.micro_average) == ("recall", LABEL, True)
    import tensorflow_model_analysis as tfma  # TFMA's own loader reads them back
    loaded = dict(tfma.load_eval_result(str(tmp_path / TFMA_FOLDER)).slicing_metrics)[()][LABEL][""]
    aggregated = {name.split("\n_")[1]: value for name, value in loaded.items() if name.startswith("micro_average: true")}
    assert aggregated["recall"]["doubleValue"] == pytest.approx(micro["recall"], abs=1e-12)  # TFMA's name for it
    assert loaded["accuracy"]["doubleValue"] == pytest.approx(overall[f"{LABEL}_accuracy"], abs=1e-12)

    with pytest.raises(ValidationError, match="aggregate: macro_average is not computed"):
        EvaluatorConfig(metrics_specs=[{"metrics": [{"class_name": "AUC"}], "aggregate": {"macro_average": True}}])
    with pytest.raises(ValidationError, match="aggregate: SparseCategoricalAccuracy is not computed micro-averaged"):
        EvaluatorConfig(metrics_specs=[{"metrics": [{"class_name": "SparseCategoricalAccuracy"}],
                                        "aggregate": {"micro_average": True}}])
