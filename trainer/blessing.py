"""The blessing decision: a candidate is blessed when its metrics pass the absolute thresholds, each
head beats the trivial model (trainer.trivial: class priors or the mean, fitted on the train split),
and it does not regress against the champion (the model being served now) beyond a tolerance;
when the champion cannot be compared, the answer is no unless evaluator.on_champion_error allows
it, and when the trivial floor cannot be computed, the answer is no."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from trainer.evaluation import (Describe, OpenSignature, eager_signature, evaluate_with_champion, example_batches,
                                label_kinds, read_description)
from trainer.evaluator_config import CALIBRATION_PLOT, EvaluatorConfig
from trainer.heads import CLASSIFICATION, Head
from trainer.metric_direction import higher_is_better
from trainer.model_spec import preprocessed_labels
from trainer.slice_gates import gate, public, slice_report
from trainer.slicing import Slicer
from trainer.trivial import Floor, TrivialModel


@dataclass
class Blessing:
    blessed: bool
    reasons: list[str]  # Every check, passed or not, in words.
    candidate: dict[str, float]
    champion: dict[str, float] | None = None
    champion_path: str | None = None
    failed: list[str] = field(default_factory=list)  # The reasons that refused it.
    trivial: dict[str, float] = field(default_factory=dict)  # The trivial model's eval metrics (the floor).
    slices: dict | None = None  # The per-slice figures and gates (trainer.slice_gates), written apart.

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "slices"}

    def slices_json(self) -> dict | None:
        """slices.json's content (trainer.slicing.SLICES_JSON), None when slices were not computed."""
        return public(self.slices) if self.slices is not None else None

    def summary(self) -> str:
        verdict = "blessed" if self.blessed else "NOT blessed"
        return f"{verdict}: " + "; ".join(self.failed or self.reasons)


def decide(candidate: dict[str, float], champion: dict[str, float] | None, config: EvaluatorConfig,
           champion_path: str | None = None, champion_problem: str | None = None,
           thresholds_only_because: str | None = None, floor: Floor | None = None, slices: dict | None = None) -> Blessing:
    """Applies the thresholds, the trivial floor, then the comparison with the champion (when there
    is one). `thresholds_only_because`: why a champion that cannot be compared does not refuse the
    candidate here (the data changed on purpose, so the champion may not read it). `floor`: the
    trivial model's metrics (evaluate_and_decide always computes one; None judges the metrics
    given alone). `slices`: trainer.slice_gates.slice_report's, gated here too."""
    reasons: list[str] = []
    failed: list[str] = []

    def check(ok: bool, text: str) -> None:
        reasons.append(text if ok else f"FAILED {text}")
        if not ok:
            failed.append(text)

    for metric, bound in sorted(config.thresholds.items()):
        value = candidate.get(metric)
        if value is None:
            check(False, f"threshold on unknown metric '{metric}' (metrics are {sorted(candidate)})")
            continue
        if bound.min is not None:
            check(value >= bound.min, f"{metric} {value:.4g} >= min {bound.min:.4g}")
        if bound.max is not None:
            check(value <= bound.max, f"{metric} {value:.4g} <= max {bound.max:.4g}")

    for ok, text in floor.checks(candidate, config.trivial_margin, config.trivial_confidence) if floor is not None else []:
        check(ok, text)

    if not config.compare_to_champion:
        reasons.append("no champion comparison (evaluator.compare_to_champion is false)")
    elif champion_problem is None and champion is None:
        reasons.append("no champion yet: first model")
    else:
        missing = [m for m in config.regression_metrics if m not in candidate]
        for metric in missing:  # The candidate's own gap: never the champion's fault.
            check(False, f"{metric} not compared: the candidate has no such metric (metrics are {sorted(candidate)})")
        if champion_problem is None:
            absent = [m for m in config.regression_metrics if m in candidate and m not in champion]
            if absent:
                champion_problem = f"the champion has no {', '.join(absent)} (metrics are {sorted(champion)})"
        if champion_problem is not None:
            # Fail closed: a candidate that could not be compared is not known to be no worse.
            text = f"champion not compared: {champion_problem}"
            if thresholds_only_because:
                reasons.append(f"{text}; blessed on the thresholds alone ({thresholds_only_because})")
            elif config.on_champion_error == "refuse":
                check(False, f"{text} (evaluator.on_champion_error is refuse)")
            else:
                reasons.append(f"{text}; blessed on the thresholds alone (evaluator.on_champion_error is thresholds_only)")
        else:
            for metric in config.regression_metrics:
                if metric in missing:
                    continue
                new, old = candidate[metric], champion[metric]
                worse = old - new if higher_is_better(metric) else new - old
                allowed = max(config.relative_tolerance * abs(old), config.absolute_tolerance)
                check(worse <= allowed, f"{metric} {new:.4g} vs champion {old:.4g} (worse by {max(worse, 0):.4g}, allowed {allowed:.4g})")
    compared = config.compare_to_champion and champion is not None and champion_problem is None
    for ok, text in _slice_checks(slices, config, compared) if slices is not None else []:
        check(ok, text)
    return Blessing(not failed, reasons, candidate, champion, champion_path, failed,
                    floor.metrics if floor is not None else {}, slices)


def _slice_checks(slices: dict, config: EvaluatorConfig, champion_compared: bool) -> list[tuple[bool, str]]:
    """Each slice gate, and one line naming the slices too small to judge."""
    checks = [(g["passed"], g["text"]) for g in gate(slices, config, champion_compared)]
    small = [f"{s['slice']} ({s['examples']})" for s in slices["slices"] if s["examples"] < config.min_slice_size]
    if small:
        checks.append((True, f"slices reported, not gated (fewer than {config.min_slice_size} examples, "
                             f"evaluator.min_slice_size): {', '.join(small)}"))
    return checks


def evaluate_and_decide(candidate_dir: str, eval_pattern: str, champion_dir: str | None, config: EvaluatorConfig,
                        thresholds_only_because: str | None = None,
                        open_signature: OpenSignature = eager_signature, train_pattern: str | None = None,
                        candidate_answers=None, train_labels: dict | None = None,
                        describe: Describe = read_description) -> Blessing:
    """Evaluates the candidate and the champion (a SavedModel folder, None when there is none) on
    the same eval examples, streamed once in `evaluator.batch_size` batches, each batch fed to both
    and to the trivial model fitted on `train_pattern`'s labels, scored row by row beside the
    candidate (none given: the floor is not computed, and the candidate is refused).
    `open_signature`: how a model's signature is called (the Evaluator passes the server's Session
    callable; the default calls it eagerly).
    `thresholds_only_because`: see decide(); `candidate_answers`: see evaluate_with_champion.
    `train_labels`: the train split's labels already summarized for some heads
    (TrivialModel.from_label_summaries); with every head there, the split is not read for them.
    `describe`: how a model's description is read (trainer.model_spec.describe_model: TFX's too)."""
    description = describe(candidate_dir)
    heads = [Head.from_json(h) for h in description["heads"]]
    preprocessed = preprocessed_labels(candidate_dir, description)  # TFMA's preprocessing_function_names
    champion_dir = champion_dir if config.compare_to_champion else None
    theirs, mismatch = None, None
    if champion_dir is not None:
        try:
            theirs = [Head.from_json(h) for h in describe(champion_dir)["heads"]]
        except Exception:  # noqa: BLE001 - evaluating it fails again, and says why, as the champion's problem
            theirs = None
    if theirs is not None:
        ours = [h.name for h in heads]
        if [h.name for h in theirs] != ours:
            mismatch = f"{champion_dir} predicts {[h.name for h in theirs]}, the candidate {ours}: metrics are not comparable"
    slicer, totals = Slicer.for_split(config.slicing_specs, eval_pattern), {}
    batches = example_batches(eval_pattern, config.batch_size, label_kinds(heads), config.eval_examples, slicer.kinds,
                              preprocessed)
    trivial, floor = _trivial_model(heads, train_pattern, config, train_labels or {}, preprocessed)
    candidate, champion, problem = evaluate_with_champion(
        candidate_dir, None if mismatch else champion_dir, batches, open_signature, heads, theirs, source=eval_pattern,
        candidate_answers=candidate_answers, trivial=trivial, describe=describe,
        slicer=slicer, slice_totals=totals, calibration_plot=_calibration_plot_heads(config, heads))
    slices = slice_report(config, totals["candidate"], totals["champion"], slicer.kinds)
    if trivial is not None:
        floor.metrics, floor.gains = trivial.metrics(), trivial.gains()
    return decide(candidate, champion, config, champion_dir, mismatch or problem, thresholds_only_because, floor, slices)


def _calibration_plot_heads(config: EvaluatorConfig, heads: list[Head]) -> frozenset[str]:
    """The heads whose TFMA CalibrationPlot is summed per slice where a spec names it: each binary
    head (class 1), and each multi-class head a spec micro-averages (its (row, class) pairs)."""
    if not config.names_plot(CALIBRATION_PLOT):
        return frozenset()
    micro = config.micro_averaged([head.name for head in heads])
    return frozenset(head.name for head in heads if head.kind == CLASSIFICATION
                     and (len(head.vocabulary) == 2 or head.name in micro))


def _trivial_model(heads, train_pattern: str | None, config: EvaluatorConfig, train_labels: dict,
                   preprocessed=None) -> tuple[TrivialModel | None, Floor]:
    """The trivial model fitted on the train split's labels (`preprocessed`: read as
    example_batches says), or None with the reason in the Floor."""
    if not heads:
        return None, Floor()
    if all(h.name in train_labels for h in heads):
        try:
            return TrivialModel.from_label_summaries(heads, train_labels), Floor(heads)
        except ValueError as exc:
            return None, Floor(heads, problem=f"{train_pattern}: {type(exc).__name__}: {exc}")
    if train_pattern is None:
        return None, Floor(heads, problem="no train split to fit it on")
    try:
        return TrivialModel.fit(heads, example_batches(train_pattern, config.batch_size, label_kinds(heads),
                                                       preprocessed=preprocessed)), Floor(heads)
    except Exception as exc:  # noqa: BLE001 - a floor that cannot be computed refuses the candidate
        return None, Floor(heads, problem=f"{train_pattern}: {type(exc).__name__}: {exc}")
