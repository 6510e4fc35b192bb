"""The `evaluator:` section of loopline.yaml: when a candidate model is blessed (trainer.blessing)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, model_validator

from trainer.config import Section
from trainer.metric_direction import HIGHER_IS_BETTER_TEXT


class Bound(Section):
    """`evaluator.thresholds.<metric>`: an absolute bound on one eval metric."""

    min: float | None = Field(None, description="The metric must be at least this; null: no lower bound.")
    max: float | None = Field(None, description="The metric must be at most this; null: no upper bound.")


class SlicingSpec(Section):
    """TFMA's SlicingSpec (`feature_keys`, `feature_values`) plus loopline's numeric buckets. No keys
    and no values: the overall slice."""

    feature_keys: list[str] = Field(default_factory=list, description="A slice per value of these features (crossed when several).")
    feature_values: dict[str, str] = Field(
        default_factory=dict, description="Only the rows holding these values (as text: island: Biscoe, year: '2008').")
    feature_buckets: dict[str, list[float]] = Field(
        default_factory=dict, description="loopline's extension: a slice per interval [b_i, b_i+1) of a numeric feature "
        "between these ascending boundaries, with (-inf, b_0) and [b_last, inf) at the ends; crossed with feature_keys. "
        "TFMA buckets through a Transform feature instead.")

    def columns(self) -> set[str]:
        """The features a slice of this spec is keyed by."""
        return set(self.feature_keys) | set(self.feature_values) | set(self.feature_buckets)

    def within(self, evaluated: "SlicingSpec") -> bool:
        """Whether this spec's slices are among an evaluated spec's: the same features, the same
        buckets, and the evaluated spec's fixed values fixed alike (TFMA's is_slice_applicable)."""
        return (self.columns() == evaluated.columns() and self.feature_buckets == evaluated.feature_buckets
                and all(self.feature_values.get(k) == v for k, v in evaluated.feature_values.items()))

    @model_validator(mode="after")
    def _ascending(self):
        for name, bounds in self.feature_buckets.items():
            if not bounds or any(a >= b for a, b in zip(bounds, bounds[1:])):
                raise ValueError(f"feature_buckets.{name}: boundaries must be ascending and distinct, got {bounds}")
        return self


def _unwrapped(values):
    """TFMA's bounds as its Python protos take them, `{value: 0.6}` (DoubleValue), also read as 0.6."""
    if isinstance(values, dict):
        return {k: v["value"] if isinstance(v, dict) and set(v) == {"value"} else v for k, v in values.items()}
    return values


class ValueThreshold(Section):
    """TFMA's GenericValueThreshold: the metric must lie in [lower_bound, upper_bound]."""

    lower_bound: float | None = Field(None, description="The metric must be at least this; null: no lower bound.")
    upper_bound: float | None = Field(None, description="The metric must be at most this; null: no upper bound.")

    _tfma_bounds = model_validator(mode="before")(_unwrapped)


class ChangeThreshold(Section):
    """TFMA's GenericChangeThreshold on diff = candidate - champion: higher_is_better passes when
    diff >= absolute and diff / champion >= relative; lower_is_better when diff <= absolute and
    diff / champion <= relative (a champion of 0 fails the relative bound, as in TFMA)."""

    direction: Literal["higher_is_better", "lower_is_better"] = Field(description="Which way the metric improves.")
    absolute: float | None = Field(None, description="Bound on candidate - champion (e.g. -0.05 with higher_is_better: "
                                   "at most 0.05 worse); null: none.")
    relative: float | None = Field(None, description="Bound on (candidate - champion) / champion; null: none.")

    @model_validator(mode="before")
    @classmethod
    def _tfma_form(cls, values):
        """TFMA's spelling too: `{value: -1e-10}` bounds and MetricDirection's HIGHER_IS_BETTER."""
        values = _unwrapped(values)
        if isinstance(values, dict) and isinstance(values.get("direction"), str):
            values = {**values, "direction": values["direction"].lower()}
        return values


class SliceThreshold(Section):
    """TFMA's PerSliceMetricThreshold: one metric's thresholds on the slices of the given specs."""

    slicing_specs: list[SlicingSpec] = Field(default_factory=lambda: [SlicingSpec()],
                                             description="The slices it applies to; [{}] is the overall slice.")
    metric: str = Field(description="A per-slice metric name, e.g. species_accuracy, body_mass_g_mae, loss.")
    value_threshold: ValueThreshold | None = Field(None, description="Absolute bounds on the slice's metric.")
    change_threshold: ChangeThreshold | None = Field(None, description="Bounds on its change against the champion's "
                                                     "on the same slice (not judged when there is no champion).")


# TFMA's confusion-matrix metrics at its default threshold 0.5 (class 1 of a binary head, or one
# class against the rest under binarize), each a figure named as TFMA names it; computed by
# trainer.slicing.CONFUSION_FIGURES. The first three are in every binary head's slices, the others
# where a metrics_spec names them.
CONFUSION_METRICS = {
    "Precision": "precision", "Recall": "recall", "F1Score": "f1_score",
    "Specificity": "specificity", "FallOut": "fall_out", "MissRate": "miss_rate",
    "NegativePredictiveValue": "negative_predictive_value", "FalseDiscoveryRate": "false_discovery_rate",
    "FalseOmissionRate": "false_omission_rate", "Prevalence": "prevalence", "ThreatScore": "threat_score",
    "BalancedAccuracy": "balanced_accuracy", "MatthewsCorrelationCoefficient": "matthews_correlation_coefficient",
    "TruePositives": "true_positives", "FalsePositives": "false_positives", "TrueNegatives": "true_negatives",
    "FalseNegatives": "false_negatives",
}
ALWAYS_CONFUSION_FIGURES = ("precision", "recall", "f1_score")
# TFMA's means of a binary head (class 1's label and probability) or a regression, per slice where a
# metrics_spec names them: Calibration is the sum of the predictions over the sum of the labels.
MEAN_METRICS = {"MeanLabel": "mean_label", "MeanPrediction": "mean_prediction", "Calibration": "calibration"}
# TFMA's regression errors beyond MSE and MAE, per slice where a metrics_spec names them: the mean
# absolute percentage error (rows labelled 0 left out, as TFMA's are) and the mean squared
# logarithmic error (log(y + 1) - log(p + 1); rows where it is not a number left out).
ERROR_METRICS = {"MeanAbsolutePercentageError": "mape", "MeanSquaredLogarithmicError": "msle"}
# TFMA's AUCPrecisionRecall: the precision-recall curve's area (TFMA's interpolation) of a binary
# head's class 1, or one class against the rest under binarize, where a metrics_spec names it.
PR_AUC = "auc_precision_recall"

# TFMA's metrics at an operating point, by class name: (the config key holding the point, the rate
# made as large as it can be, the rate held at least at the point). Sensitivity is recall.
OPERATING_POINT_METRICS = {"PrecisionAtRecall": ("recall", "precision", "recall"),
                           "RecallAtPrecision": ("precision", "recall", "precision"),
                           "SensitivityAtSpecificity": ("specificity", "recall", "specificity"),
                           "SpecificityAtSensitivity": ("sensitivity", "specificity", "recall")}


@dataclass(frozen=True)
class OperatingPoint:
    """One such metric of a spec: the figure `<head>_<name>` is the largest `best` rate over the
    thresholds whose `given` rate is at least `at` (trainer.slicing.operating_point)."""

    name: str
    best: str
    given: str
    at: float


# TFMA's metrics (MetricConfig.class_name) and the figure each is of a head, `<head>_<figure>`,
# with the head kind it exists for (None: any). A class name outside this table is refused.
TFMA_METRICS = {
    # Example weights are not taken (every row weighs 1), so the weighted count is the count.
    "ExampleCount": ("examples", None), "WeightedExampleCount": ("examples", None),
    "BinaryAccuracy": ("accuracy", "classification"), "Accuracy": ("accuracy", "classification"),
    "CategoricalAccuracy": ("accuracy", "classification"), "SparseCategoricalAccuracy": ("accuracy", "classification"),
    "AUC": ("auc", "classification"),
    "BinaryCrossentropy": ("loss", "classification"), "CategoricalCrossentropy": ("loss", "classification"),
    "SparseCategoricalCrossentropy": ("loss", "classification"),
    **{class_name: (figure, "classification") for class_name, figure in CONFUSION_METRICS.items()},
    **{class_name: (figure, None) for class_name, figure in MEAN_METRICS.items()},
    "AUCPrecisionRecall": (PR_AUC, "classification"),
    "RootMeanSquaredError": ("rmse", "regression"), "MeanSquaredError": ("mse", "regression"),
    "MeanAbsoluteError": ("mae", "regression"),
    **{class_name: (figure, "regression") for class_name, figure in ERROR_METRICS.items()},
    # Named by the metric's name (precision_at_recall unless its config names it otherwise).
    **{class_name: (tfma_name, "classification") for class_name, tfma_name in (
        ("PrecisionAtRecall", "precision_at_recall"), ("RecallAtPrecision", "recall_at_precision"),
        ("SensitivityAtSpecificity", "sensitivity_at_specificity"),
        ("SpecificityAtSensitivity", "specificity_at_sensitivity"))},
}
# TFMA's plots a metrics_spec may name (written to the evaluation's plots, components/tfma_result,
# by TFMA's plot names); a plot has no value, so no threshold. MultiClassConfusionMatrixPlot (each
# classifier's matrix at TFMA's default threshold 0.0, the top class) is written whether named or
# not, and the Overall slice's calibration histogram in loopline's bins unless CalibrationPlot is
# named; where a spec names them, ConfusionMatrixPlot (a binary head's class 1 at TFMA's 1,002
# thresholds) and CalibrationPlot (a binary head's class 1 in TFMA's 1,002 buckets), every slice.
CONFUSION_MATRIX_PLOT, CALIBRATION_PLOT = "ConfusionMatrixPlot", "CalibrationPlot"
TFMA_PLOTS = {CONFUSION_MATRIX_PLOT: "confusion_matrix_plot", CALIBRATION_PLOT: "calibration_plot",
              "MultiClassConfusionMatrixPlot": "multi_class_confusion_matrix_plot"}
# Naming one of these says a one-column output is a probability (or logit) of the class 1, as in TFMA.
BINARY_METRICS = frozenset({"BinaryAccuracy", "BinaryCrossentropy", "AUC", "AUCPrecisionRecall", *CONFUSION_METRICS,
                            *OPERATING_POINT_METRICS, CONFUSION_MATRIX_PLOT})


# MetricConfig.module: TFMA's own metrics (empty) and Keras' (tfma.metrics.specs_from_metrics writes
# tf_keras' module path for a Keras metric) are computed as loopline's figures; any other module is
# a custom metric, refused.
METRIC_MODULES = ("tensorflow_model_analysis", "tf_keras", "keras", "tensorflow.keras", "tensorflow.python.keras")
# MetricConfig.config, the metric's settings as specs_from_metrics serializes them (its get_config()):
# `name` (any text) names the metric; every other setting must hold one of the values loopline
# computes (its TFMA or Keras default, or what loopline does anyway), else the config is refused by
# name. By class name, after the settings every class may carry.
# A curve's num_thresholds may be any count (Keras' AUC writes 200, TFMA's 10,000): it sets how
# finely the same area or operating point is approximated, and loopline's are over the AUC's own
# 1,001 thresholds (trainer.slicing.threshold_counts) whatever it says.
ANY_COUNT = "any count"
_PROBABILISTIC = {"from_logits": (False, True),  # loopline reads scores as probabilities or logits itself
                  "label_smoothing": (0,), "axis": (-1,), "ignore_class": (None,)}
_AT_HALF = {"thresholds": (None, 0.5, [0.5]), "top_k": (None,), "class_id": (None,)}
METRIC_SETTINGS = {
    "AUC": {"curve": ("ROC", "PR"), "num_thresholds": ANY_COUNT, "summation_method": ("interpolation",),
            "thresholds": (None,), "top_k": (None,), "class_id": (None,)},
    "AUCPrecisionRecall": {"num_thresholds": ANY_COUNT, "summation_method": ("interpolation",),
                           "thresholds": (None,), "top_k": (None,), "class_id": (None,)},
    "BinaryAccuracy": {"threshold": (None, 0.5), "top_k": (None,), "class_id": (None,)},
    **{class_name: _PROBABILISTIC for class_name in
       ("BinaryCrossentropy", "CategoricalCrossentropy", "SparseCategoricalCrossentropy")},
    **{class_name: _AT_HALF for class_name in CONFUSION_METRICS},
    "ConfusionMatrixPlot": {"num_thresholds": (None, 1000)},
    "CalibrationPlot": {"num_buckets": (1000,), "left": (None,), "right": (None,)},
    "MultiClassConfusionMatrixPlot": {"num_thresholds": (None,), "thresholds": (None,)},
    # ...and the operating point itself (OPERATING_POINT_METRICS), a number in [0, 1].
    **{class_name: {"num_thresholds": ANY_COUNT, "thresholds": (None,), "top_k": (None,), "class_id": (None,)}
       for class_name in OPERATING_POINT_METRICS},
}
ANY_METRIC_SETTINGS = {"dtype": (None, "float32")}


def tfma_metric_name(class_name: str) -> str:
    """The name TFMA gives a metric of this class (Keras' default: BinaryAccuracy -> binary_accuracy,
    AUC -> auc, F1Score -> f1_score, AUCPrecisionRecall -> auc_precision_recall), by which
    MetricsSpec's `thresholds` and `per_slice_thresholds` name it."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", class_name).lower()


class MetricThreshold(Section):
    """TFMA's MetricThreshold."""

    value_threshold: ValueThreshold | None = Field(None, description="Absolute bounds on the metric.")
    change_threshold: ChangeThreshold | None = Field(None, description="Bounds on its change against the champion's "
                                                     "(not judged when there is no champion).")


class MetricConfig(Section):
    """TFMA's MetricConfig: a metric by its class name, and its threshold."""

    class_name: str = Field(description=f"One of {', '.join([*TFMA_METRICS, *TFMA_PLOTS])}.")
    module: str = Field("", description="TFMA's or Keras' metrics module (as tfma.metrics.specs_from_metrics writes "
                        "it), or empty; a custom metric's module is refused.")
    config: str | dict = Field(
        "", description="The metric's settings, as JSON text (as specs_from_metrics writes them) or a mapping: "
        "`name` renames the metric (the spec's threshold maps then name it so); AUC's `curve` ROC or PR; any other "
        "setting only at its TFMA default (e.g. BinaryAccuracy's threshold 0.5), else refused by name.")
    threshold: MetricThreshold | None = Field(None, description="Gates the figure on every evaluated slice, as TFMA "
                                              "does: the overall one whatever its examples, the others from "
                                              "min_slice_size examples.")

    @model_validator(mode="after")
    def _known(self):
        if self.class_name not in TFMA_METRICS and self.class_name not in TFMA_PLOTS:
            raise ValueError(f"metric class_name {self.class_name!r} is not computed by loopline's Evaluator; "
                             f"it computes {', '.join(TFMA_METRICS)} and the plots {', '.join(TFMA_PLOTS)}")
        if self.is_plot and self.threshold is not None:
            raise ValueError(f"metric {self.class_name}: a plot has no value to gate; a threshold names a metric")
        if self.module and not self.module.startswith(tuple(f"{m}." for m in METRIC_MODULES) + METRIC_MODULES):
            raise ValueError(f"metric {self.class_name}: module {self.module!r} is a custom metric, which loopline's "
                             f"Evaluator does not run; it computes TFMA's and Keras' metrics of the names above")
        point = OPERATING_POINT_METRICS[self.class_name][0] if self.class_name in OPERATING_POINT_METRICS else None
        at = self.settings.get(point)
        if point and (isinstance(at, bool) or not isinstance(at, (int, float)) or not 0 <= at <= 1):
            raise ValueError(f"metric {self.class_name}: config needs its {point}, one number in [0, 1] (another "
                             f"{point} is another metric, with its own name), got {json.dumps(at)}")
        allowed = {**ANY_METRIC_SETTINGS, **METRIC_SETTINGS.get(self.class_name, {})}
        for key, value in self.settings.items():
            if key not in ("name", point) and (key not in allowed or not _allowed(value, allowed[key])):
                values = allowed.get(key, ())
                values = "an integer above 1 or null" if values == ANY_COUNT else " or ".join(map(json.dumps, values))
                raise ValueError(f"metric {self.class_name}: config {key}={json.dumps(value)} is not computed by "
                                 "loopline's Evaluator; " + (f"it takes {key}={values}" if values else
                                                             f"{self.class_name} takes no {key}"))
        return self

    @property
    def settings(self) -> dict:
        """`config` as a mapping (TFMA writes it as JSON text)."""
        if isinstance(self.config, dict):
            return self.config
        try:
            settings = json.loads(self.config) if self.config.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"metric {self.class_name}: config is not JSON ({exc}): {self.config!r}") from None
        if not isinstance(settings, dict):
            raise ValueError(f"metric {self.class_name}: config must be a JSON object, got {self.config!r}")
        return settings

    @property
    def metric_name(self) -> str:
        """TFMA's name for it: the config's `name`, else the class's default name."""
        return self.settings.get("name") or tfma_metric_name(self.class_name)

    @property
    def figure_name(self) -> str:
        """Which of a head's figures it is (AUC with curve PR is the precision-recall AUC), or which plot."""
        if self.is_plot:
            return TFMA_PLOTS[self.class_name]
        if self.class_name == "AUC" and self.settings.get("curve") == "PR":
            return PR_AUC
        if self.class_name in OPERATING_POINT_METRICS:
            return self.metric_name
        return TFMA_METRICS[self.class_name][0]

    @property
    def operating_point(self) -> OperatingPoint | None:
        if self.class_name not in OPERATING_POINT_METRICS:
            return None
        point, best, given = OPERATING_POINT_METRICS[self.class_name]
        return OperatingPoint(self.metric_name, best, given, float(self.settings[point]))

    @property
    def is_plot(self) -> bool:
        return self.class_name in TFMA_PLOTS

    def figure(self, head: str, kind: str) -> str:
        """The metric's name among a head's figures; for a head of another kind a name no figure has
        (its threshold then refuses the candidate, naming it)."""
        for_kind = TFMA_METRICS[self.class_name][1]
        return f"{head}_{self.figure_name}" if for_kind in (None, kind) else f"{head}_{self.class_name}"


def _allowed(value, allowed) -> bool:
    """A config value is one of the allowed (0 == 0.0, but False is not 0), or a count where any is."""
    if allowed == ANY_COUNT:
        return value is None or (type(value) is int and value > 1)
    return any(value == a and (type(value) is type(a) or {type(value), type(a)} <= {int, float}) for a in allowed)


# Figures computed one class against the rest (MetricsSpec.binarize.class_ids), from the per-class
# histograms of the class's probability at TFMA's threshold 0.5 (trainer.slicing.class_figures).
BINARIZED_FIGURES = frozenset({"accuracy", "auc", PR_AUC, *CONFUSION_METRICS.values()})
# ...and those a binarized spec keeps as they are, of the whole head (ExampleCount).
UNBINARIZED_FIGURES = frozenset({"examples"})


# The metrics a multi-class head has micro-averaged (MetricsSpec.aggregate.micro_average): over every
# (row, class) pair, the class's probability against whether the row is of the class, as TFMA
# flattens them (trainer.slicing.micro_figures): the binary metrics, the means and a binary head's
# plots, of those pairs; the example count stays the head's.
MICRO_METRICS = frozenset({"BinaryAccuracy", "BinaryCrossentropy", "AUC", "AUCPrecisionRecall", *CONFUSION_METRICS,
                           *MEAN_METRICS, *OPERATING_POINT_METRICS, CONFUSION_MATRIX_PLOT, CALIBRATION_PLOT,
                           "ExampleCount", "WeightedExampleCount"})


def class_figure(figure: str, class_id: int) -> str:
    """A head's figure of one class against the rest: `species_recall` -> `species_recall_class_2`."""
    return f"{figure}_class_{class_id}"


def micro_figure(figure: str) -> str:
    """A head's figure micro-averaged over its classes: `species_recall` -> `species_recall_micro_average`."""
    return f"{figure}_micro_average"


class ClassIds(Section):
    """TFMA's RepeatedInt32Value."""

    values: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, description="Class ids (0..k-1).")


class BinarizationOptions(Section):
    """TFMA's BinarizationOptions, its class_ids (k_list and top_k_list are not computed)."""

    class_ids: ClassIds = Field(default_factory=ClassIds, description="The classes each metric is computed for, "
                                "one against the rest, at probability 0.5: {values: [0, 2]}.")


class ExampleWeightOptions(Section):
    """TFMA's ExampleWeightOptions. loopline takes no example weights (there is no
    ModelSpec.example_weight_key), so, as TFMA's without that key, weighted figures are unweighted."""

    weighted: bool = Field(False, description="Weighted figures: every row weighs 1.")
    unweighted: bool = Field(False, description="Unweighted figures.")


class AggregationOptions(Section):
    """TFMA's AggregationOptions: its micro_average (macro averages, class weights and top_k_list are
    not computed)."""

    micro_average: bool = Field(False, description="Each metric over every (row, class) pair of a multi-class head, "
                                "the class's probability against whether the row is of it, as <head>_<figure>_micro_average.")

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, values):
        unknown = sorted(k for k, v in values.items() if k != "micro_average" and v) if isinstance(values, dict) else []
        if unknown:
            raise ValueError(f"metrics_specs aggregate: {', '.join(unknown)} is not computed by loopline's Evaluator; "
                             "it computes micro_average")
        return {k: v for k, v in values.items() if k == "micro_average"} if isinstance(values, dict) else values


class PerSliceMetricThreshold(Section):
    """TFMA's PerSliceMetricThreshold: a threshold on the slices of the given specs."""

    slicing_specs: list[SlicingSpec] = Field(default_factory=lambda: [SlicingSpec()],
                                             description="The slices it applies to; [{}] is the overall slice.")
    threshold: MetricThreshold = Field(description="The value and change thresholds on those slices.")


class PerSliceMetricThresholds(Section):
    """TFMA's PerSliceMetricThresholds: the value of MetricsSpec.per_slice_thresholds."""

    thresholds: list[PerSliceMetricThreshold] = Field(default_factory=list, description="Each a threshold and its slices.")


class MetricsSpec(Section):
    """TFMA's MetricsSpec: its metrics apply to every head, or to those of `output_names`."""

    metrics: list[MetricConfig] = Field(default_factory=list, description="The metrics, e.g. [{class_name: "
                                        "BinaryAccuracy, threshold: {value_threshold: {lower_bound: 0.6}}}].")
    output_names: list[str] = Field(default_factory=list, description="The heads the metrics are of; []: every head. "
                                    "A name that is not a head of the candidate refuses it.")
    thresholds: dict[str, MetricThreshold] = Field(
        default_factory=dict, description="Thresholds by TFMA's metric name (binary_accuracy, auc, precision, "
        "root_mean_squared_error...), each of a metric in `metrics`, on every evaluated slice as a metric's own.")
    per_slice_thresholds: dict[str, PerSliceMetricThresholds] = Field(
        default_factory=dict, description="Thresholds on the slices of their slicing_specs, by TFMA's metric name; "
        "slices of fewer than min_slice_size examples are reported, not gated.")
    example_weights: ExampleWeightOptions | None = Field(
        None, description="TFMA's example_weights ({weighted: true} or {unweighted: true}, as TFMA's default specs "
        "write them): accepted; without example weights both are the same figures.")
    binarize: BinarizationOptions | None = Field(
        None, description="TFMA's binarize: the metrics (accuracy, AUC and the confusion-matrix metrics) of each "
        "class id one against the rest, as <head>_<figure>_class_<id>; each threshold applies to every class id.")
    aggregate: AggregationOptions | None = Field(
        None, description="TFMA's aggregate: {micro_average: true} computes the metrics of a multi-class head over "
        "every (row, class) pair (TFMA's default multi-class specs name it).")

    @model_validator(mode="after")
    def _named_metrics(self):
        names = self.by_class()
        for field, keys in (("thresholds", self.thresholds), ("per_slice_thresholds", self.per_slice_thresholds)):
            unknown = sorted(set(keys) - set(names))
            if unknown:
                raise ValueError(f"metrics_specs {field}: {', '.join(unknown)} is not a metric of the spec's metrics; "
                                 f"they are named {', '.join(names) or 'nothing (metrics is empty)'}")
        allowed = BINARIZED_FIGURES | UNBINARIZED_FIGURES
        per_class = [m.class_name for m in self.metrics
                     if m.is_plot or (m.figure_name not in allowed and m.operating_point is None)]
        if self.binarize is not None and self.binarize.class_ids.values and per_class:
            raise ValueError(f"metrics_specs binarize: {', '.join(per_class)} is not computed per class; with binarize "
                             f"the metrics are {', '.join(c for c, (f, _) in TFMA_METRICS.items() if f in allowed)}, "
                             f"{', '.join(OPERATING_POINT_METRICS)}")
        unmicro = [m.class_name for m in self.metrics if m.class_name not in MICRO_METRICS]
        if self.micro_average and unmicro:
            raise ValueError(f"metrics_specs aggregate: {', '.join(unmicro)} is not computed micro-averaged; "
                             f"micro-averaged the metrics are {', '.join(sorted(MICRO_METRICS))}")
        return self

    @property
    def micro_average(self) -> bool:
        return self.aggregate is not None and self.aggregate.micro_average

    def figures(self, metric: MetricConfig, head: str, kind: str | None) -> list[str]:
        """The figures a metric of this spec is of one head: one, or one per binarized class id and
        one micro-averaged."""
        figure = metric.figure(head, kind)
        ids = self.binarize.class_ids.values if self.binarize is not None else []
        if metric.figure_name in UNBINARIZED_FIGURES:
            return [figure]
        out = [class_figure(figure, c) for c in ids] + ([micro_figure(figure)] if self.micro_average else [])
        return out or [figure]

    def by_class(self) -> dict[str, MetricConfig]:
        """The spec's metrics (not its plots: nothing gates a plot) by TFMA's name for them."""
        return {m.metric_name: m for m in self.metrics if not m.is_plot}


# The outputs TFMA takes as the prediction, in this order, when a signature answers several and
# ModelSpec.prediction_key names none (metric_util.to_label_prediction_example_weight).
COMMON_PREDICTION_KEYS = ("scores", "outputs", "predictions", "logistic", "probabilities", "logits")


class EvaluatorConfig(Section):
    """When a candidate model is blessed (and so pushed)."""

    thresholds: dict[str, Bound] = Field(
        default_factory=dict,
        description="Absolute bounds on eval metrics, e.g. {species_accuracy: {min: 0.8}, loss: {max: 0.3}}.",
    )
    compare_to_champion: bool = Field(True, description="Refuse candidates that regress against the champion (labelled, else last pushed).")
    on_champion_error: Literal["refuse", "thresholds_only"] = Field(
        "refuse",
        description="When the champion cannot be compared (it cannot be evaluated on the candidate's eval split, "
                    "its heads differ, or a compared metric is missing on its side): refuse the candidate, "
                    "or bless it on the thresholds alone, saying so.",
    )
    regression_metrics: list[str] = Field(
        default_factory=lambda: ["loss"], description="Metrics compared with the champion. Direction by one rule, the "
        f"one early stopping uses: a name with a word {HIGHER_IS_BETTER_TEXT} is higher-is-better, others lower. "
        "weighted_loss (heads weighted as training "
        "ended) is there for a module with loss_weights.")
    relative_tolerance: float = Field(0.05, ge=0, description="Allowed worsening as a fraction of the champion's value...")
    absolute_tolerance: float = Field(0.01, ge=0, description="...or in the metric's units, whichever is larger.")
    trivial_margin: float = Field(
        0.01, ge=0, lt=1, description="Each head's eval loss must be at least this fraction below the trivial "
        "model's (the train split's class priors, or its mean label for regression), or the candidate is not blessed.",
    )
    trivial_confidence: Annotated[float, Field(ge=0.5, lt=1)] | Literal[0] = Field(
        0.95, description="...and its gain over the trivial model, row by row on the eval split, must be "
        "above 0 at this one-sided confidence (mean gain minus z standard errors), so that a model that learned "
        "nothing is not blessed for beating the trivial one by the eval rows' chance alone. 0: not tested.",
    )
    label_key: str | None = Field(
        None, description="TFMA's ModelSpec.label_key: the label a model loopline did not export (a TFX module's "
        "run_fn) is evaluated on; null: data.label. loopline's own exports name their labels themselves.")
    signature_name: str = Field(
        "serving_default", description="TFMA's ModelSpec.signature_name: the signature of such a model that is called on "
        "serialized tf.Examples; its output (evaluator.prediction_key's) predicts the label (k >= 2 columns: scores or logits of the classes "
        "0..k-1; one column: a regression).")
    prediction_key: str = Field(
        "", description="TFMA's ModelSpec.prediction_key: which output of such a model's signature predicts the label "
        "when it answers several; empty: its only output, else the first of TFMA's common keys it answers "
        f"({', '.join(COMMON_PREDICTION_KEYS)}).")
    preprocessing_function_names: list[str] = Field(
        default_factory=list, description="TFMA's ModelSpec.preprocessing_function_names: signatures of such a model "
        "called on the serialized tf.Examples, in order, whose outputs hold evaluator.label_key (TFX's "
        "`transform_features` answering a label the Transform made, e.g. species_xf); []: the label is read from the "
        "examples.")
    metrics_specs: list[MetricsSpec] = Field(
        default_factory=list, description="TFMA's metrics_specs: metric class names (ExampleCount, BinaryAccuracy, AUC, "
        "Precision, MeanSquaredError...; each one of the Evaluator's own figures), their thresholds (gated on every "
        "evaluated slice), the thresholds and per_slice_thresholds maps by TFMA's metric name, output_names and "
        "binarize. A binary metric named (BinaryAccuracy, BinaryCrossentropy, AUC, or a confusion-matrix metric such "
        "as Precision, Recall, F1Score, Specificity) reads a model's one-column output as the probability (or logit) "
        "of the label 1, not as a regression.")
    eval_examples: int | None = Field(None, ge=1, description="Evaluate on at most this many eval examples (null: all).")
    batch_size: int = Field(4096, ge=1, description="Eval examples per batch, streamed once and fed to the candidate and the champion.")
    slicing_specs: list[SlicingSpec] = Field(
        default_factory=list, description="TFMA's slicing_specs: metrics per slice of the eval split, in the same pass; "
        "the overall slice is always there. E.g. [{feature_keys: [island]}, {feature_keys: [island, sex]}, "
        "{feature_buckets: {body_mass_g: [3500, 4500]}}].")
    slice_thresholds: list[SliceThreshold] = Field(
        default_factory=list, description="TFMA's per-slice MetricThresholds (value and change vs the champion); "
        "applied to slices of at least min_slice_size examples, the others reported.")
    min_slice_size: int = Field(30, ge=1, description="Slices with fewer eval examples are reported, not gated.")
    slice_guard: bool = Field(True, description="Compare every slice of at least min_slice_size examples with the "
                              "champion on regression_metrics, as the overall figures are.")
    slice_relative_tolerance: float | None = Field(None, ge=0, description="The slices' relative_tolerance; null: relative_tolerance.")
    slice_absolute_tolerance: float | None = Field(None, ge=0, description="The slices' absolute_tolerance; null: absolute_tolerance.")

    @model_validator(mode="after")
    def _thresholds_on_evaluated_slices(self):
        """A threshold's slices must be computed: the overall slice or one of slicing_specs (TFMA
        fails such a threshold as a missing slice; here the config says so before a run)."""
        specs = [spec for t in self.slice_thresholds for spec in t.slicing_specs]
        specs += [spec for m in self.metrics_specs for ts in m.per_slice_thresholds.values()
                  for t in ts.thresholds for spec in t.slicing_specs]
        for spec in specs:
            if spec != SlicingSpec() and not any(spec.within(evaluated) for evaluated in self.slicing_specs):
                raise ValueError(f"a threshold's slicing spec {spec.model_dump(exclude_defaults=True)} is not within "
                                 "evaluator.slicing_specs, so its slices are not evaluated; add it there")
        return self

    @property
    def binary(self) -> bool:
        """Whether metrics_specs names a binary metric (a one-column output is then a classifier's)."""
        return any(m.class_name in BINARY_METRICS for spec in self.metrics_specs for m in spec.metrics)

    def metric_thresholds(self, heads: dict[str, str]) -> list[SliceThreshold]:
        """metrics_specs' thresholds as per-slice thresholds, one per head of the spec (`heads`: name ->
        kind): a metric's own threshold and the `thresholds` map on every evaluated slice (TFMA's
        slice spec None), and the `per_slice_thresholds` map on its specs' slices. An output name
        that is no head keeps its name, so its figure is missing and the threshold refuses the
        candidate."""
        out, every = [], [SlicingSpec(), *self.slicing_specs]  # TFMA: a threshold without a spec is on every slice
        for spec in self.metrics_specs:
            metrics = spec.by_class()
            wanted = [(m, every, m.threshold) for m in spec.metrics if m.threshold is not None]
            wanted += [(metrics[name], every, t) for name, t in spec.thresholds.items()]
            wanted += [(metrics[name], t.slicing_specs, t.threshold)
                       for name, ts in spec.per_slice_thresholds.items() for t in ts.thresholds]
            for head in spec.output_names or list(heads):
                out += [SliceThreshold(slicing_specs=slices, metric=figure, value_threshold=t.value_threshold,
                                       change_threshold=t.change_threshold)
                        for metric, slices, t in wanted for figure in spec.figures(metric, head, heads.get(head))]
        return out

    def slice_figures(self) -> list[str | OperatingPoint]:
        """The optional figures the slices carry: ALWAYS_CONFUSION_FIGURES, and the other confusion
        figures, the means, the regression errors, the precision-recall AUC and the operating points
        where metrics_specs name them."""
        metrics = [m for spec in self.metrics_specs for m in spec.metrics if not m.is_plot]
        named = {m.figure_name for m in metrics}
        optional = {*CONFUSION_METRICS.values(), *MEAN_METRICS.values(), *ERROR_METRICS.values(), PR_AUC}
        points = {m.operating_point.name: m.operating_point for m in metrics if m.operating_point is not None}
        return [*ALWAYS_CONFUSION_FIGURES, *sorted(named & optional - set(ALWAYS_CONFUSION_FIGURES)), *points.values()]

    def names_plot(self, class_name: str) -> bool:
        """Whether a metrics_spec names this plot (TFMA_PLOTS)."""
        return any(m.class_name == class_name for spec in self.metrics_specs for m in spec.metrics)

    def micro_averaged(self, heads: list[str]) -> set[str]:
        """The heads whose figures are wanted micro-averaged (metrics_specs' aggregate)."""
        return {head for spec in self.metrics_specs if spec.micro_average for head in spec.output_names or heads}

    def binarized_classes(self, heads: list[str]) -> dict[str, list[int]]:
        """The class ids each head's figures are wanted for one against the rest (metrics_specs' binarize)."""
        out: dict[str, set[int]] = {}
        for spec in self.metrics_specs:
            if spec.binarize is not None:
                for head in spec.output_names or heads:
                    out.setdefault(head, set()).update(spec.binarize.class_ids.values)
        return {head: sorted(ids) for head, ids in out.items()}
