"""TFLite variants vs the SavedModel: size and latency, side by side in one process.

Trains the generic tabular model on the bundled penguins data for a few epochs, exports it with
all four TFLite variants (each through the parity gate), then times `predict_raw` for one example
and for a batch of 256 in the SavedModel (TensorFlow) and in each variant (LiteRT).

Sizes are compared twice: whole files (the SavedModel folder vs the flatbuffer) and weight bytes
vs weight bytes (`saved_model_weight_bytes`, `tflite_weight_bytes`), since a folder's graph,
signatures and checkpoint bookkeeping are not weights.
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
# TFLite builtin ops that carry learned weights, and the input positions of their weight tensors
# (filter, bias; TRANSPOSE_CONV takes its output shape first). Other constants (shapes, the
# encoder's means and vocabularies) are graph constants in the SavedModel too, not variables.
WEIGHT_INPUTS = {"FULLY_CONNECTED": (1, 2), "CONV_2D": (1, 2), "DEPTHWISE_CONV_2D": (1, 2), "CONV_3D": (1, 2),
                 "TRANSPOSE_CONV": (1, 3), "BATCH_MATMUL": (1,), "EMBEDDING_LOOKUP": (1,)}
VARIANTS = ["float32", "dynamic_range", "float16", "int8"]
RUNS = 200
BATCH = 256


def run() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result, report, serving, batch = _train_and_export(Path(tmp))
        saved, fastest = _saved_model_rows(serving, report, batch)
        rows = {"saved_model": saved, "saved_model_session": fastest}
        for variant in report["tflite"]:
            rows[f"tflite_{variant['variant']}"] = _tflite_row(variant, batch)
    for row in rows.values():
        _add_ratios(row, saved, fastest)
    _print_table(rows)
    return {"eval_accuracy": result.metrics["species_accuracy"], "latency_runs": RUNS, "batch": BATCH,
            "weight_bytes_method": "SavedModel: its trainable + non-trainable variables, each once; TFLite: the constant "
                                   "buffers of the weight inputs of " + ", ".join(WEIGHT_INPUTS)
                                   + " (through DEQUANTIZE), each buffer once",
            "models": rows}


def _train_and_export(folder: Path):
    """(training result, export report, SavedModel folder, a batch of BATCH eval examples)."""
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
    return result, report, serving, batch


def _saved_model_rows(serving: Path, report: dict, batch: dict) -> tuple[dict, dict]:
    """The eager signature call, and the SavedModel's fastest call: the Session callable the
    server uses (the eager call pays tf.function's Python per call)."""
    raw = tf.saved_model.load(str(serving)).signatures["predict_raw"]
    tf_batch = {k: tf.constant(v) for k, v in batch.items()}
    sizes = {"size_bytes": report["saved_model"]["size_bytes"], "weight_bytes": saved_model_weight_bytes(str(serving)),
             "variables_file_bytes": sum(f.stat().st_size for f in (serving / "variables").iterdir())}
    saved = {**sizes, "latency_ms_1": report["saved_model"]["latency_ms"],
             f"latency_ms_{BATCH}": tflite.median_ms(lambda: raw(**tf_batch), RUNS // 4)}
    session = _session_call(serving)
    fastest = {**sizes, "latency_ms_1": tflite.median_ms(lambda: session({k: v[:1] for k, v in batch.items()}), RUNS),
               f"latency_ms_{BATCH}": tflite.median_ms(lambda: session(batch), RUNS // 4)}
    return saved, fastest


def _tflite_row(variant: dict, batch: dict) -> dict:
    from ai_edge_litert.interpreter import Interpreter

    content = Path(variant["path"]).read_bytes()
    runner = Interpreter(model_content=content).get_signature_runner("predict_raw")
    inputs = tflite.as_numpy_inputs(batch)
    one = tflite.as_numpy_inputs({k: v[:1] for k, v in batch.items()})
    # The export times only the variants that pass the gate; time the others here.
    latency_1 = variant["latency_ms"] or tflite.median_ms(lambda: runner(**one), RUNS)
    return {
        "size_bytes": variant["size_bytes"],
        "weight_bytes": tflite_weight_bytes(content),
        "latency_ms_1": latency_1,
        f"latency_ms_{BATCH}": tflite.median_ms(lambda: runner(**inputs), RUNS // 4),
        "max_abs_diff_scores": variant["max_abs_diff"]["scores"],
        "accuracy_delta": variant["metric_delta"]["species_accuracy"],
        "parity_passed": variant["passed"],
    }


def _add_ratios(row: dict, saved: dict, fastest: dict) -> None:
    row["latency_1_vs_session"] = round(row["latency_ms_1"] / fastest["latency_ms_1"], 4)
    row[f"latency_{BATCH}_vs_session"] = round(row[f"latency_ms_{BATCH}"] / fastest[f"latency_ms_{BATCH}"], 4)
    row["size_vs_saved_model"] = round(row["size_bytes"] / saved["size_bytes"], 4)
    row["weight_bytes_vs_saved_model"] = round(row["weight_bytes"] / saved["weight_bytes"], 4)
    row["latency_1_vs_saved_model"] = round(row["latency_ms_1"] / saved["latency_ms_1"], 4)
    row[f"latency_{BATCH}_vs_saved_model"] = round(row[f"latency_ms_{BATCH}"] / saved[f"latency_ms_{BATCH}"], 4)


def _print_table(rows: dict) -> None:
    print(f"{'model':<22}{'weights B':>10}{'x':>7}{'file B':>10}{'x':>7}{'1 ex ms':>10}{'x':>8}{BATCH:>5} ex ms{'x':>8}")
    for name, row in rows.items():
        print(f"{name:<22}{row['weight_bytes']:>10,}{row['weight_bytes_vs_saved_model']:>7.3f}{row['size_bytes']:>10,}"
              f"{row['size_vs_saved_model']:>7.3f}{row['latency_ms_1']:>10.3f}{row['latency_1_vs_saved_model']:>8.3f}"
              f"{row[f'latency_ms_{BATCH}']:>11.3f}{row[f'latency_{BATCH}_vs_saved_model']:>8.3f}")


def saved_model_weight_bytes(path: str) -> int:
    """Bytes of the model's weights in a SavedModel: its loaded object's trainable and
    non-trainable variables, each counted once (the variables/ checkpoint on disk is larger: a
    Keras export tracks every variable twice, in `variables` and `_all_variables`)."""
    loaded = tf.saved_model.load(path)
    unique = {id(v): v for v in list(loaded.trainable_variables) + list(loaded.non_trainable_variables)}
    return sum(int(np.prod(v.shape)) * v.dtype.size for v in unique.values())


def tflite_weight_bytes(model_content: bytes) -> int:
    """Bytes of the weight tensors' constant buffers in a TFLite flatbuffer: the weight inputs
    (WEIGHT_INPUTS) of the ops that carry learned weights, followed back through DEQUANTIZE (a
    float16 or int8 weight is stored narrow and widened at run time), each buffer counted once.
    Quantization scales live in tensor metadata, not buffers, and are not counted."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.python.schema_util import get_builtin_code_from_operator_code

    model = schema.Model.GetRootAsModel(model_content, 0)
    names = {code: name for name, code in vars(schema.BuiltinOperator).items() if not name.startswith("_")}

    def op_name(op) -> str:
        return names.get(get_builtin_code_from_operator_code(model.OperatorCodes(op.OpcodeIndex())), "")

    def size(buffer_index: int) -> int:
        buffer = model.Buffers(buffer_index)
        return buffer.DataLength() or int(buffer.Size())  # Size: data kept after the flatbuffer (> 2 GB models)

    weights = set()
    for s in range(model.SubgraphsLength()):
        graph = model.Subgraphs(s)
        ops = [graph.Operators(i) for i in range(graph.OperatorsLength())]
        producer = {int(t): op for op in ops for t in op.OutputsAsNumpy()}
        for op in ops:
            inputs = op.InputsAsNumpy()
            for position in WEIGHT_INPUTS.get(op_name(op), ()):
                if position >= len(inputs) or inputs[position] < 0:
                    continue  # an optional input left out (a layer without bias)
                tensor = int(inputs[position])
                source = producer.get(tensor)
                if source is not None and op_name(source) == "DEQUANTIZE":
                    tensor = int(source.InputsAsNumpy()[0])
                buffer = graph.Tensors(tensor).Buffer()
                if size(buffer):  # a constant
                    weights.add(buffer)
    return sum(size(b) for b in weights)


def _session_call(serving: Path):
    """`predict_raw` through serving's Session callable, fed the dtypes its signature declares."""
    from tensorflow.core.protobuf import saved_model_pb2

    from serving.signature_call import SignatureCallers

    graph = saved_model_pb2.SavedModel.FromString((serving / "saved_model.pb").read_bytes())
    signature = graph.meta_graphs[0].signature_def["predict_raw"]
    call = SignatureCallers(str(serving), {"predict_raw": signature}).callers["predict_raw"]
    dtypes = {name: tf.dtypes.as_dtype(spec.dtype).as_numpy_dtype for name, spec in signature.inputs.items()}
    return lambda features: call({k: np.asarray(v, dtypes[k]) for k, v in features.items()})
