"""The export report and TFLite variants of a SavedModel loopline did not export (a TFX run_fn's),
behind the same parity gate as loopline's own: its tf.Example signature is converted with TFLite's
builtin ops and run in LiteRT on eval examples beside the SavedModel.

A model that needs TensorFlow ops beyond the builtins (parsing tf.Examples: ParseExampleV2; a
Transform graph's ops) cannot be converted that way. TFLite's "select" ops would carry them, but
the LiteRT installed here has no Flex delegate to run them, so their parity could not be checked
(nor would TF Serving's TFLite path run them): such a variant is dropped, with the ops named in the
report, and the run goes on. A variant that converts and misses parity follows
`export.required_variants` as loopline's do.
"""
from __future__ import annotations

import logging
import os

import numpy as np
import tensorflow as tf

from trainer import tflite
from trainer.evaluation import read_examples
from trainer.export import TFLITE_DIR, folder_bytes, signatures_of, write_file, write_report
from trainer.export_config import ExportConfig

log = logging.getLogger("loopline.export")


def export_foreign(saved_model_dir: str, artifact_dir: str, signature: str, train_pattern: str, eval_pattern: str,
                   metrics: dict[str, float], config: ExportConfig) -> dict:
    """Writes `export_report.json`/`.md` into `artifact_dir` and each variant that passes parity
    into its TFLite folder; returns the report. Raises tflite.ParityError after writing it when a
    required variant converted but missed parity."""
    loaded = tf.saved_model.load(saved_model_dir)
    function = loaded.signatures[signature]
    inputs = function.structured_input_signature[1]
    report = {"signatures": signatures_of(loaded),
              "saved_model": {"path": saved_model_dir, "size_bytes": folder_bytes(saved_model_dir), "latency_ms": None},
              "metrics": metrics, "tflite": [], "signature": signature}
    results = []
    if config.tflite_variants and (len(inputs) != 1 or next(iter(inputs.values())).dtype != tf.string):
        results = [_dropped(v, f"signature {signature!r} takes {sorted(inputs)}, not one input of serialized "
                               "tf.Examples: no examples to check its parity on") for v in config.tflite_variants]
    elif config.tflite_variants:
        results, report["saved_model"]["latency_ms"] = _variants(
            saved_model_dir, artifact_dir, signature, next(iter(inputs)), loaded, train_pattern, eval_pattern, config)
    report["tflite"] = [r.to_json() for r in results]
    tf.io.gfile.makedirs(artifact_dir)
    write_report(artifact_dir, report)
    required = [r for r in results if not r.passed and not r.dropped]  # converted, missed parity, required
    if required:
        raise tflite.ParityError(required)
    return report


def _variants(saved_model_dir: str, artifact_dir: str, signature: str, input_name: str, loaded, train_pattern: str,
              eval_pattern: str, config: ExportConfig) -> tuple[list[tflite.VariantReport], float]:
    """Each variant's report, and the SavedModel's single-example latency (ms). `loaded`: the
    folder's SavedModel, which the converter uses instead of loading it again for each variant."""
    function = loaded.signatures[signature]
    examples = read_examples(eval_pattern, config.parity_examples)
    if not examples:
        raise ValueError(f"no eval examples in {eval_pattern}")
    features = {input_name: np.array(examples, dtype=object)}
    reference = tflite.run_saved_model(function, features)
    one = {input_name: features[input_name][:1]}
    representative = None
    if "int8" in config.tflite_variants:
        representative = {input_name: np.array(read_examples(train_pattern, config.representative_examples), dtype=object)}
    results = []
    for variant, content in tflite.convert_each(saved_model_dir, config.tflite_variants, representative, loaded,
                                                signature=signature).items():
        if isinstance(content, Exception):  # an unconvertible variant is reported, never a crash
            results.append(_dropped(variant, tflite.conversion_problem(content)))
            continue
        path = os.path.join(artifact_dir, TFLITE_DIR, f"model_{variant}.tflite")
        tf.io.gfile.makedirs(os.path.dirname(path))
        write_file(path, content)
        result = tflite.check_variant(variant, content, reference, features, {}, [], config.output_tolerance[variant],
                                      config.metric_tolerance[variant], path, signature=signature)
        if result.passed:
            result.latency_ms = tflite.tflite_latency_ms(content, one, config.latency_runs, signature=signature)
        elif variant not in config.required_variants:
            tf.io.gfile.remove(path)
            result.dropped = True
        results.append(result)
    return results, tflite.saved_model_latency_ms(function, one, config.latency_runs)


def _dropped(variant: str, problem: str) -> tflite.VariantReport:
    log.warning("tflite %s dropped: %s", variant, problem)
    return tflite.VariantReport(variant, None, 0, problems=[problem], dropped=True)
