"""Evaluating an exported SavedModel on the eval split, and the blessing decision: a candidate
is blessed when its metrics pass the absolute thresholds and do not regress against the champion
(the model being served now) beyond a tolerance."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

import numpy as np
import tensorflow as tf

from serving import signature_names as names
from trainer.evaluator_config import EvaluatorConfig
from trainer.features import parse_examples
from trainer.heads import CLASSIFICATION, Head, HeadTotals, higher_is_better
from trainer.inputs import record_dataset

def _description_path(saved_model_dir: str) -> str:
    return names.signature_file(saved_model_dir)


def read_description(saved_model_dir: str) -> dict:
    """What trainer.export recorded beside the SavedModel (features, heads, signature layout)."""
    path = _description_path(saved_model_dir)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"{saved_model_dir} is not a loopline export: {path} is missing")
    with tf.io.gfile.GFile(path) as f:
        return json.loads(f.read())


def read_signature(saved_model_dir: str) -> tuple[dict[str, str], list[Head]]:
    """The feature kinds and heads recorded at export time."""
    data = read_description(saved_model_dir)
    return data["features"], [Head.from_json(h) for h in data["heads"]]


def prediction_key(heads: list[Head], head: Head) -> str:
    """The `predict_raw` output holding a head's prediction (trainer.export.named_outputs names
    them so), also the layout-1 `serving_default`'s."""
    first = head is heads[0]
    if head.kind == CLASSIFICATION:
        return names.SCORES if first else f"{head.name}_{names.SCORES}"
    return names.OUTPUTS if first else head.name


def evaluation_signature(layout: int, heads: list[Head]) -> tuple[str, dict[str, str]]:
    """The tf.Example signature answering for every head, and each head's output in it: `predict`
    (`<head>_scores`, `<head>_outputs`), or in exports before it (layout 1) `serving_default`."""
    if layout >= 2:
        return names.PREDICT, {h.name: names.head_output(h.name, names.SCORES if h.kind == CLASSIFICATION else names.OUTPUTS)
                               for h in heads}
    return names.DEFAULT, {h.name: prediction_key(heads, h) for h in heads}


def label_kinds(heads: list[Head]) -> dict[str, str]:
    """The label columns to parse (parse_examples keys them by head name)."""
    return {h.label_column: h.label_dtype for h in heads}


def head_metrics(heads: list[Head], predictions: dict[str, np.ndarray], labels: dict[str, np.ndarray]) -> dict[str, float]:
    """The trainer's evaluation metrics (HeadTotals) of predictions by head name against the raw
    label columns (`[rows, 1]`, as parse_examples gives them)."""
    totals = HeadTotals(heads)
    totals.add({h.name: h.encode_label(tf.constant(labels[h.name])) for h in heads},
               {h.name: tf.constant(predictions[h.name], tf.float32) for h in heads})
    return totals.metrics()


def read_examples(file_pattern: str, limit: int | None = None) -> list[bytes]:
    """Serialized tf.Examples of a split (GZIP TFRecords), in file order."""
    dataset = record_dataset(file_pattern)
    if limit:
        dataset = dataset.take(limit)
    return list(dataset.as_numpy_iterator())


def evaluate_saved_model(saved_model_dir: str, examples: list[bytes], batch_size: int = 256,
                         heads: list[Head] | None = None) -> dict[str, float]:
    """Metrics of an exported model, computed from its `predict` answers (`serving_default`'s
    for exports before it) on serialized eval examples (`read_examples`). `heads`: its
    read_signature heads, when already read."""
    description = read_description(saved_model_dir)
    heads = heads if heads is not None else [Head.from_json(h) for h in description["heads"]]
    signature, keys = evaluation_signature(description.get("layout", 1), heads)
    serve = tf.saved_model.load(saved_model_dir).signatures[signature]
    predictions: dict[str, list] = {h.name: [] for h in heads}
    labels: dict[str, list] = {h.name: [] for h in heads}
    for start in range(0, len(examples), batch_size):
        chunk = tf.constant(examples[start:start + batch_size])
        out = serve(inputs=chunk)
        parsed = parse_examples(chunk, label_kinds(heads))
        for head in heads:
            predictions[head.name].append(out[keys[head.name]].numpy())
            labels[head.name].append(parsed[head.name].numpy())
    return head_metrics(
        heads,
        {k: np.concatenate(v) for k, v in predictions.items()},
        {k: np.concatenate(v) for k, v in labels.items()},
    )


def _is_loopline_export(saved_model_dir: str) -> bool:
    return tf.io.gfile.exists(_description_path(saved_model_dir))


@dataclass
class Blessing:
    blessed: bool
    reasons: list[str]  # Every check, passed or not, in words.
    candidate: dict[str, float]
    champion: dict[str, float] | None = None
    champion_path: str | None = None
    failed: list[str] = field(default_factory=list)  # The reasons that refused it.

    def to_json(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        verdict = "blessed" if self.blessed else "NOT blessed"
        return f"{verdict}: " + "; ".join(self.failed or self.reasons)


def decide(candidate: dict[str, float], champion: dict[str, float] | None, config: EvaluatorConfig,
           champion_path: str | None = None, champion_problem: str | None = None,
           thresholds_only_because: str | None = None) -> Blessing:
    """Applies the thresholds, then the comparison with the champion (when there is one).
    `thresholds_only_because`: why a champion that cannot be compared does not refuse the
    candidate here (the data changed on purpose, so the champion may not read it)."""
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
    return Blessing(not failed, reasons, candidate, champion, champion_path, failed)


def evaluate_and_decide(candidate_dir: str, eval_pattern: str, champion_dir: str | None, config: EvaluatorConfig,
                        thresholds_only_because: str | None = None) -> Blessing:
    """Evaluates the candidate and the champion (a SavedModel folder, None when there is none) on
    the same eval examples, read once. `thresholds_only_because`: see decide()."""
    examples = read_examples(eval_pattern, config.eval_examples)
    if not examples:
        raise ValueError(f"no eval examples in {eval_pattern}")
    heads = read_signature(candidate_dir)[1]
    candidate = evaluate_saved_model(candidate_dir, examples, heads=heads)
    if not config.compare_to_champion:
        champion_dir = None
    champion, problem = None, None
    if champion_dir is not None:
        theirs = read_signature(champion_dir)[1] if _is_loopline_export(champion_dir) else None
        ours = [h.name for h in heads]
        if theirs is not None and [h.name for h in theirs] != ours:
            problem = f"{champion_dir} predicts {[h.name for h in theirs]}, the candidate {ours}: metrics are not comparable"
            return decide(candidate, None, config, champion_dir, problem, thresholds_only_because)
        try:
            champion = evaluate_saved_model(champion_dir, examples, heads=theirs)
        except Exception as exc:  # decide() refuses the candidate unless on_champion_error allows it.
            problem = f"{champion_dir} could not be evaluated ({type(exc).__name__}: {exc})"
    return decide(candidate, champion, config, champion_dir, problem, thresholds_only_because)
