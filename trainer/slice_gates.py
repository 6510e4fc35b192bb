"""The per-slice figures (slices.json, trainer.slicing.SLICES_JSON) and their gates: the default
guard (each slice of at least `evaluator.min_slice_size` examples compared with the champion on
`evaluator.regression_metrics`, as the overall figures are), `evaluator.slice_thresholds` with
TFMA's MetricThreshold semantics, and `evaluator.metrics_specs`' thresholds on the slices they apply to.
Fail closed: a gated metric the candidate lacks refuses it."""
from __future__ import annotations

import math

from trainer.evaluator_config import CALIBRATION_PLOT, CONFUSION_MATRIX_PLOT, EvaluatorConfig
from trainer.metric_direction import higher_is_better
from trainer.slicing import SliceTotals, slice_name, spec_matches


def slice_report(config: EvaluatorConfig, candidate: SliceTotals, champion: SliceTotals | None,
                 kinds: dict[str, str] | None = None) -> dict:
    """slices.json without its gates: every slice (Overall first, then in the specs' order), its
    examples and both models' metrics, the candidate's confusion matrices, the calibration bins.
    `kinds`: how each slicing feature is stored (Slicer.kinds), for TFMA's typed slice keys."""
    heads = [head.name for head in candidate.heads]
    slices, class_ids, micro = [], config.binarized_classes(heads), config.micro_averaged(heads)
    figures, curves = config.slice_figures(), config.names_plot(CONFUSION_MATRIX_PLOT)
    calibration = config.names_plot(CALIBRATION_PLOT)
    for key in candidate.sums:  # insertion order: Overall is in every batch's first segment
        examples = candidate.examples(key)
        slices.append({"slice": slice_name(key), "features": dict(key), "examples": examples,
                       "candidate": candidate.metrics(key, class_ids, figures, micro),
                       "champion": champion.metrics(key, class_ids, figures, micro) if champion is not None and key in champion.sums else None,
                       "confusion": candidate.confusion(key), "gated": examples >= config.min_slice_size,
                       "_key": key, **({"_plot_counts": candidate.plot_counts(key, micro)} if curves else {}),
                       **({"_calibration_plot": candidate.calibration_plot(key)} if calibration else {})})
    slices.sort(key=lambda s: (bool(s["_key"]), _spec_index(config, s["_key"]), s["slice"]))
    return {"slicing_specs": [s.model_dump() for s in config.slicing_specs], "min_slice_size": config.min_slice_size,
            "slices": slices, "calibration": candidate.calibration_bins(), "gates": [], "_kinds": dict(kinds or {}),
            "_heads": {head.name: head.kind for head in candidate.heads}}


def _spec_index(config: EvaluatorConfig, key) -> int:
    return next((i for i, spec in enumerate(config.slicing_specs) if spec_matches(spec, key)), -1)


def gate(report: dict, config: EvaluatorConfig, champion_compared: bool) -> list[dict]:
    """The report's gates (also left in report["gates"]), each {slice, metric, candidate, champion,
    bound, passed, text}. `champion_compared`: the overall comparison with the champion took place
    (no champion, or one that could not be compared, leaves only the value thresholds)."""
    # (threshold, whether it gates the overall slice whatever its examples: TFMA's metrics_specs do)
    thresholds = [(t, True) for t in config.metric_thresholds(report.get("_heads", {}))]
    thresholds += [(t, False) for t in config.slice_thresholds]
    gates, matched = [], set()
    for entry in report["slices"]:
        judged = entry["examples"] >= config.min_slice_size
        if config.slice_guard and champion_compared and entry["_key"] and judged:
            gates += [_guard(entry, metric, config) for metric in config.regression_metrics]
        for i, (threshold, any_size) in enumerate(thresholds):
            if not any(spec_matches(spec, entry["_key"]) for spec in threshold.slicing_specs):
                continue
            matched.add(i)
            if judged or (any_size and not entry["_key"]):
                gates += _threshold(entry, threshold, champion_compared)
    # TFMA's missing_slices: a threshold whose specs match no evaluated slice fails.
    gates += [_missing(threshold) for i, (threshold, _) in enumerate(thresholds) if i not in matched]
    report["gates"] = gates
    return gates


def _missing(threshold) -> dict:
    specs = [spec.model_dump(exclude_defaults=True) for spec in threshold.slicing_specs]
    return {"slice": "(none of its specs)", "metric": threshold.metric, "candidate": None, "champion": None,
            "bound": "a slice to judge", "passed": False, "missing": specs,
            "text": f"{threshold.metric}: no evaluated slice is of the threshold's slicing specs {specs} "
                    "(no eval example holds those values)"}


def _gate(entry: dict, metric: str, bound: str, passed: bool, text: str) -> dict:
    new, old = entry["candidate"].get(metric), (entry["champion"] or {}).get(metric)
    return {"slice": entry["slice"], "metric": metric, "candidate": new, "champion": old, "bound": bound,
            "passed": bool(passed), "text": f"slice {entry['slice']}: {text}"}


def _guard(entry: dict, metric: str, config: EvaluatorConfig) -> dict:
    relative = config.relative_tolerance if config.slice_relative_tolerance is None else config.slice_relative_tolerance
    absolute = config.absolute_tolerance if config.slice_absolute_tolerance is None else config.slice_absolute_tolerance
    new, old = entry["candidate"].get(metric), (entry["champion"] or {}).get(metric)
    bound = f"worse by at most max({relative:g} x champion, {absolute:g})"
    if new is None or old is None:
        who = "the candidate" if new is None else "the champion"
        return _gate(entry, metric, bound, new is None and old is None,
                     f"{metric} not compared: {who} has no such figure on this slice")
    worse = old - new if higher_is_better(metric) else new - old
    allowed = max(relative * abs(old), absolute)
    return _gate(entry, metric, bound, worse <= allowed,
                 f"{metric} {new:.4g} vs champion {old:.4g} (worse by {max(worse, 0):.4g}, allowed {allowed:.4g})")


def _threshold(entry: dict, threshold, champion_compared: bool) -> list[dict]:
    """TFMA's GenericValueThreshold and GenericChangeThreshold (metrics_validator._check_threshold)."""
    metric, out = threshold.metric, []
    new, old = entry["candidate"].get(metric), (entry["champion"] or {}).get(metric)
    if new is None:
        return [_gate(entry, metric, "a threshold", False, f"{metric} not computed for the candidate "
                      f"(its metrics are {sorted(entry['candidate'])})")]
    value = threshold.value_threshold
    if value is not None:
        low = -math.inf if value.lower_bound is None else value.lower_bound
        high = math.inf if value.upper_bound is None else value.upper_bound
        out.append(_gate(entry, metric, f"[{low:g}, {high:g}]", low <= new <= high, f"{metric} {new:.4g} in [{low:g}, {high:g}]"))
    change = threshold.change_threshold
    if change is not None and champion_compared:
        bound = f"{change.direction}, absolute {change.absolute}, relative {change.relative}"
        if old is None:
            out.append(_gate(entry, metric, bound, False, f"{metric} change not computed: the champion has no such figure"))
        else:
            diff = new - old
            ratio = math.nan if math.isclose(old, 0.0) else diff / old
            passed = all(_within(measure, limit, change.direction) for measure, limit
                         in ((diff, change.absolute), (ratio, change.relative)) if limit is not None)
            out.append(_gate(entry, metric, bound, passed, f"{metric} {new:.4g} vs champion {old:.4g} "
                             f"(change {diff:+.4g}, relative {ratio:+.4g}; bound {bound})"))
    return out


def _within(measure: float, limit: float, direction: str) -> bool:
    """TFMA's comparison: NaN (a relative change against 0) fails either way."""
    return measure >= limit if direction == "higher_is_better" else measure <= limit


def public(report: dict) -> dict:
    """The report as written (slices.json): without what is kept for matching and TFMA's slice keys."""
    return {**{k: v for k, v in report.items() if not k.startswith("_")},
            "slices": [{k: v for k, v in s.items() if not k.startswith("_")} for s in report["slices"]]}
