"""TFLite variants of the `predict_raw` signature, each checked against the SavedModel.

After a conversion the variant runs in LiteRT's interpreter (ai_edge_litert) on eval examples;
the largest output difference and the metric delta must stay within the variant's tolerance,
or the export fails with the figures. This catches broken conversions (e.g. variables that were
not frozen, read back as garbage through READ_VARIABLE) as well as too lossy quantization.
"""
from __future__ import annotations

import gc
import re
import statistics
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import numpy as np
import tensorflow as tf

from serving import signature_names as names
from trainer.evaluation import head_metrics, prediction_key
from trainer.heads import CLASSIFICATION, Head

SIGNATURE = names.PREDICT_RAW


class ParityError(RuntimeError):
    """A TFLite variant differs from the SavedModel beyond its tolerance."""

    def __init__(self, reports: list["VariantReport"]):
        self.reports = reports
        lines = [f"{r.variant}: " + "; ".join(r.problems) for r in reports if not r.passed]
        super().__init__("TFLite parity check failed:\n  " + "\n  ".join(lines))


@dataclass
class VariantReport:
    variant: str
    path: str | None
    size_bytes: int
    max_abs_diff: dict[str, float] = field(default_factory=dict)  # per output (regression: in stds)
    metric_delta: dict[str, float] = field(default_factory=dict)  # accuracy; RMSE in stds
    latency_ms: float | None = None  # median single-example invocation
    examples: int = 0
    problems: list[str] = field(default_factory=list)
    dropped: bool = False  # failed parity, not required (export.required_variants): its file was removed

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def convert_variants(saved_model_dir: str, variants: list[str],
                     representative: dict[str, np.ndarray] | None = None, loaded=None,
                     signature: str = SIGNATURE) -> dict[str, bytes]:
    """Converts the SavedModel's `signature` (loopline's exports: `predict_raw`) to each variant,
    with one converter: each variant sets every option a variant sets (the same bytes as a converter
    of its own). `loaded`: the folder's SavedModel as the caller already loaded it
    (`tf.saved_model.load`), which the converter then uses instead of loading it again."""
    if not variants:
        return {}
    out = {}
    with _saved_model_loaded_once(saved_model_dir, loaded):
        converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_dir, signature_keys=[signature])
        with _collector_sees_new_objects_only():
            for variant in variants:
                _set_variant(converter, variant, representative)
                out[variant] = converter.convert()
    return out


def convert_each(saved_model_dir: str, variants: list[str], representative: dict[str, np.ndarray] | None = None,
                 loaded=None, signature: str = SIGNATURE) -> dict[str, bytes | Exception]:
    """convert_variants, and where that fails, each variant on its own: {variant: its bytes, or
    the converter's exception}, never a raise (an unconvertible variant is reported, not a crash)."""
    try:
        return convert_variants(saved_model_dir, variants, representative, loaded, signature)
    except Exception:  # noqa: BLE001 - which variant failed is found below
        out = {}
        for variant in variants:
            try:
                out[variant] = convert_variants(saved_model_dir, [variant], representative, loaded, signature)[variant]
            except Exception as exc:  # noqa: BLE001
                out[variant] = exc
        return out


def conversion_problem(exc: Exception) -> str:
    """The converter's refusal in one line: the TensorFlow ops TFLite's builtins lack, when it names them."""
    text = str(exc)
    ops = sorted(set(re.findall(r"TF Select ops: ([^\n]+)", text)))
    if ops:
        return (f"not convertible with TFLite's builtin ops: it needs {', '.join(ops)} (TFLite select ops; the "
                "LiteRT here has no Flex delegate to run them, so their parity cannot be checked)")
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"not convertible: {type(exc).__name__}: {first[:300]}"


@contextmanager
def _saved_model_loaded_once(saved_model_dir: str, loaded):
    """TensorFlow's SavedModel converter loads the whole SavedModel when it is made, and again in
    every convert() only to read its debug information (about 0.3 CPU s each for the penguins
    model). Those loads of this folder get `loaded` instead: the same folder, so the same functions
    and debug information, and the same bytes out. Other folders, or a TensorFlow whose converter
    loads otherwise, go on as before."""
    from tensorflow.lite.python import lite

    load = getattr(lite, "_load", None)
    if loaded is None or load is None:
        yield
        return

    def load_once(export_dir, tags=None, options=None):
        return loaded if export_dir == saved_model_dir else load(export_dir, tags, options)

    lite._load = load_once
    try:
        yield
    finally:
        lite._load = load


def _set_variant(converter: tf.lite.TFLiteConverter, variant: str, representative: dict[str, np.ndarray] | None) -> None:
    converter.optimizations = set()  # the converter's defaults: what a previous variant set goes
    converter.target_spec.supported_types = set()
    converter.target_spec.supported_ops = {tf.lite.OpsSet.TFLITE_BUILTINS}
    converter.representative_dataset = None
    if variant == "float32":
        return
    if variant == "dynamic_range":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    elif variant == "float16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif variant == "int8":
        if not representative:
            raise ValueError("the int8 variant needs representative examples from the train split")
        size = len(next(iter(representative.values())))

        def samples():
            for i in range(size):
                yield {name: values[i:i + 1] for name, values in representative.items()}

        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = samples
        # Integer kernels for every quantizable op; inputs and outputs stay float32/strings so
        # the variant keeps predict_raw's interface (strings and NaNs cannot be int8).
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    else:
        raise ValueError(f"unknown TFLite variant {variant!r}")


@contextmanager
def _collector_sees_new_objects_only():
    """The converter runs a full gc.collect() on each conversion; in a pipeline's process (TF,
    TFX, Beam and MLflow loaded) scanning every object alive costs seconds. The objects alive
    before the conversion are set aside meanwhile (gc.freeze), so it scans only the
    conversion's own, which are the ones it means to free. Where the caller has set objects
    aside already (`loopline run` does, after its imports), that stays as it is: unfreezing
    would give the caller's back to the collector."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def as_numpy_inputs(features: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """LiteRT wants strings as bytes arrays and numbers as float32."""
    out = {}
    for name, values in features.items():
        values = np.asarray(values)
        out[name] = values.astype(np.bytes_) if values.dtype.kind in "OSU" else values.astype(np.float32)
    return out


def run_tflite(model_content: bytes, features: dict[str, np.ndarray], batch_size: int = 256,
               signature: str = SIGNATURE) -> dict[str, np.ndarray]:
    """Runs the variant's `signature` over all rows, in batches."""
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_content=model_content).get_signature_runner(signature)
    features = as_numpy_inputs(features)
    rows = len(next(iter(features.values())))
    chunks: dict[str, list] = {}
    for start in range(0, rows, batch_size):
        out = runner(**{k: v[start:start + batch_size] for k, v in features.items()})
        for key, value in out.items():
            chunks.setdefault(key, []).append(value)
    return {k: np.concatenate(v) for k, v in chunks.items()}


def run_saved_model(signature, features: dict[str, np.ndarray], batch_size: int = 256) -> dict[str, np.ndarray]:
    rows = len(next(iter(features.values())))
    chunks: dict[str, list] = {}
    for start in range(0, rows, batch_size):
        out = signature(**{k: tf.constant(v[start:start + batch_size]) for k, v in features.items()})
        for key, value in out.items():
            chunks.setdefault(key, []).append(value.numpy())
    return {k: np.concatenate(v) for k, v in chunks.items()}


def output_scale(heads: list[Head], key: str) -> float:
    """Regression outputs are compared in units of the label's standard deviation."""
    for head in heads:
        if head.kind != CLASSIFICATION and prediction_key(heads, head) == key:
            return head.std or 1.0
    return 1.0


def compare(variant: str, tflite_out: dict[str, np.ndarray], reference: dict[str, np.ndarray], heads: list[Head],
            labels: dict[str, np.ndarray], output_tolerance: float, metric_tolerance: float, report: VariantReport) -> None:
    """Fills the report's differences and problems."""
    missing = sorted(set(reference) - set(tflite_out))
    if missing:
        report.problems.append(f"outputs {missing} missing (it has {sorted(tflite_out)})")
        return
    comparable = True  # metrics need every output in the SavedModel's shape
    for key, expected in reference.items():
        got = tflite_out[key]
        if got.shape != expected.shape:
            report.problems.append(f"output '{key}' has shape {got.shape}, the SavedModel {expected.shape}")
            comparable = False
            continue
        if expected.dtype.kind in "OSU":
            mismatches = int((got.astype(np.bytes_) != expected.astype(np.bytes_)).sum())
            report.max_abs_diff[key] = float(mismatches)
            if mismatches:
                report.problems.append(f"output '{key}' differs in {mismatches} strings")
            continue
        diff = np.abs(got.astype(np.float64) - expected.astype(np.float64)) / output_scale(heads, key)
        worst = float(np.nan_to_num(diff, nan=np.inf).max()) if diff.size else 0.0
        report.max_abs_diff[key] = worst
        if not worst <= output_tolerance:
            report.problems.append(f"output '{key}' max abs diff {worst:.3g} > tolerance {output_tolerance:.3g}")
    if not comparable:
        return
    # The metric delta is reported even when an output is over its tolerance: it says how much
    # the difference matters.
    mine = head_metrics(heads, {h.name: tflite_out[prediction_key(heads, h)] for h in heads}, labels)
    theirs = head_metrics(heads, {h.name: reference[prediction_key(heads, h)] for h in heads}, labels)
    for head in heads:
        metric = f"{head.name}_accuracy" if head.kind == CLASSIFICATION else f"{head.name}_rmse"
        scale = 1.0 if head.kind == CLASSIFICATION else (head.std or 1.0)
        delta = abs(mine[metric] - theirs[metric]) / scale
        report.metric_delta[metric] = delta
        if not delta <= metric_tolerance:
            report.problems.append(
                f"{metric} {mine[metric]:.4g} vs SavedModel {theirs[metric]:.4g} (delta {delta:.3g} > tolerance {metric_tolerance:.3g})"
            )


def check_variant(variant: str, model_content: bytes, reference: dict[str, np.ndarray], features: dict[str, np.ndarray],
                  labels: dict[str, np.ndarray], heads: list[Head], output_tolerance: float, metric_tolerance: float,
                  path: str | None = None, signature: str = SIGNATURE) -> VariantReport:
    """The parity gate for one variant; a variant that does not even load fails it too."""
    report = VariantReport(variant, path, len(model_content), examples=len(next(iter(features.values()))))
    try:
        out = run_tflite(model_content, features, signature=signature)
    except Exception as exc:  # A corrupt flatbuffer raises here (LiteRT verifies it on load).
        report.problems.append(f"does not run in LiteRT: {type(exc).__name__}: {exc}")
        return report
    compare(variant, out, reference, heads, labels, output_tolerance, metric_tolerance, report)
    return report


def tflite_latency_ms(model_content: bytes, one_example: dict[str, np.ndarray], runs: int,
                      signature: str = SIGNATURE) -> float:
    """Median wall time of one single-example `signature` invocation."""
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_content=model_content).get_signature_runner(signature)
    inputs = as_numpy_inputs(one_example)
    return median_ms(lambda: runner(**inputs), runs)


def saved_model_latency_ms(signature, one_example: dict[str, np.ndarray], runs: int) -> float:
    inputs = {k: tf.constant(v) for k, v in one_example.items()}
    return median_ms(lambda: signature(**inputs), runs)


def median_ms(call, runs: int) -> float:
    """Median wall time of `call` in milliseconds, after one untimed call (allocation, tracing)."""
    call()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000
