"""TFLite variants vs the SavedModel: size and latency, side by side in one process.

Trains the generic tabular model on the bundled penguins data for a few epochs, exports it with
all four TFLite variants (each through the parity gate), then times `predict_raw` for one example
and for a batch of 256 in the SavedModel (TensorFlow) and in each variant (LiteRT).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf

from trainer import tflite
from trainer.config import TrainerConfig
from trainer.csv_examples import csv_to_tfrecords
from trainer.evaluation import read_examples
from trainer.export import REPORT_JSON, export_model
from trainer.export_config import ExportConfig
from trainer.features import parse_examples
from trainer.loop import train

DATA = Path(__file__).resolve().parent.parent / "data" / "penguins.csv"
VARIANTS = ["float32", "dynamic_range", "float16", "int8"]
RUNS = 200
BATCH = 256


def run() -> dict:
    from ai_edge_litert.interpreter import Interpreter

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        train_pattern, eval_pattern = csv_to_tfrecords(str(DATA), str(folder))
        result = train(TrainerConfig(epochs=10), train_pattern, eval_pattern, "species")
        serving = folder / "model" / "Format-Serving"
        try:
            report = export_model(result.model, result.kinds, result.heads, result.metrics, str(serving),
                                  str(folder / "model"), train_pattern, eval_pattern,
                                  ExportConfig(tflite_variants=VARIANTS, latency_runs=RUNS))
        except tflite.ParityError as refused:  # a finding to report, not a reason to stop measuring
            print(f"tflite: {refused}")
            report = json.loads((folder / "model" / REPORT_JSON).read_text())  # written before the gate raised
        examples = read_examples(eval_pattern)
        features = {k: v.numpy() for k, v in parse_examples(tf.constant(examples), result.kinds).items()}
        batch = {k: np.resize(v, (BATCH, 1)) for k, v in features.items()}
        raw = tf.saved_model.load(str(serving)).signatures["predict_raw"]
        tf_batch = {k: tf.constant(v) for k, v in batch.items()}
        saved_batch_ms = tflite.median_ms(lambda: raw(**tf_batch), RUNS // 4)
        saved = {"size_bytes": report["saved_model"]["size_bytes"], "latency_ms_1": report["saved_model"]["latency_ms"],
                 f"latency_ms_{BATCH}": saved_batch_ms}
        # The SavedModel's fastest call: the Session callable the server uses (the eager signature
        # call above pays tf.function's Python per call).
        session = _session_call(serving)
        fastest = {"size_bytes": saved["size_bytes"],
                   "latency_ms_1": tflite.median_ms(lambda: session({k: v[:1] for k, v in batch.items()}), RUNS),
                   f"latency_ms_{BATCH}": tflite.median_ms(lambda: session(batch), RUNS // 4)}
        rows = {"saved_model": saved, "saved_model_session": fastest}
        for variant in report["tflite"]:
            runner = Interpreter(model_path=variant["path"]).get_signature_runner("predict_raw")
            inputs = tflite.as_numpy_inputs(batch)
            one = tflite.as_numpy_inputs({k: v[:1] for k, v in batch.items()})
            # The export times only the variants that pass the gate; time the others here.
            latency_1 = variant["latency_ms"] or tflite.median_ms(lambda: runner(**one), RUNS)
            rows[f"tflite_{variant['variant']}"] = {
                "size_bytes": variant["size_bytes"],
                "latency_ms_1": latency_1,
                f"latency_ms_{BATCH}": tflite.median_ms(lambda: runner(**inputs), RUNS // 4),
                "max_abs_diff_scores": variant["max_abs_diff"]["scores"],
                "accuracy_delta": variant["metric_delta"]["species_accuracy"],
                "parity_passed": variant["passed"],
            }
    for name, row in rows.items():
        row["latency_1_vs_session"] = round(row["latency_ms_1"] / fastest["latency_ms_1"], 4)
        row[f"latency_{BATCH}_vs_session"] = round(row[f"latency_ms_{BATCH}"] / fastest[f"latency_ms_{BATCH}"], 4)
        row["size_vs_saved_model"] = round(row["size_bytes"] / saved["size_bytes"], 4)
        row["latency_1_vs_saved_model"] = round(row["latency_ms_1"] / saved["latency_ms_1"], 4)
        row[f"latency_{BATCH}_vs_saved_model"] = round(row[f"latency_ms_{BATCH}"] / saved[f"latency_ms_{BATCH}"], 4)
    print(f"{'model':<22}{'size B':>10}{'size x':>9}{'1 ex ms':>10}{'x':>8}{BATCH:>5} ex ms{'x':>8}")
    for name, row in rows.items():
        print(f"{name:<22}{row['size_bytes']:>10,}{row['size_vs_saved_model']:>9.3f}{row['latency_ms_1']:>10.3f}"
              f"{row['latency_1_vs_saved_model']:>8.3f}{row[f'latency_ms_{BATCH}']:>11.3f}{row[f'latency_{BATCH}_vs_saved_model']:>8.3f}")
    return {"eval_accuracy": result.metrics["species_accuracy"], "latency_runs": RUNS, "batch": BATCH, "models": rows}


def _session_call(serving: Path):
    """`predict_raw` through serving's Session callable, fed the dtypes its signature declares."""
    from tensorflow.core.protobuf import saved_model_pb2

    from serving.signature_call import SignatureCallers

    graph = saved_model_pb2.SavedModel.FromString((serving / "saved_model.pb").read_bytes())
    signature = graph.meta_graphs[0].signature_def["predict_raw"]
    call = SignatureCallers(str(serving), {"predict_raw": signature}).callers["predict_raw"]
    dtypes = {name: tf.dtypes.as_dtype(spec.dtype).as_numpy_dtype for name, spec in signature.inputs.items()}
    return lambda features: call({k: np.asarray(v, dtypes[k]) for k, v in features.items()})
