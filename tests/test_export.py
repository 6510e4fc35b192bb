"""Export without TFX: float32 SavedModel with warmup, TFLite variants behind the parity gate,
the report; trained for a few steps on GZIP TFRecords written here."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer import tflite
from trainer.config import TrainerConfig
from trainer.csv_examples import csv_to_tfrecords
from trainer.evaluation import evaluate_saved_model, label_kinds, read_examples
from trainer.export import (REPORT_JSON, REPORT_MD, TFLITE_DIR, _parsed_numpy, export_model, export_saved_model,
                            float32_model)
from trainer.export_config import ExportConfig
from trainer.features import parse_examples
from trainer.loop import train
from trainer.warmup import read_warmup

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("export")
    train_pattern, eval_pattern = csv_to_tfrecords(str(REPO / "data" / "penguins.csv"), str(folder))
    result = train(TrainerConfig(epochs=4, batch_size=32), train_pattern, eval_pattern, "species")
    return result, train_pattern, eval_pattern, folder


@pytest.fixture(scope="module")
def exported(trained):
    result, train_pattern, eval_pattern, folder = trained
    artifact = folder / "model"
    serving = artifact / "Format-Serving"
    config = ExportConfig(tflite_variants=["float32", "dynamic_range", "float16", "int8"], latency_runs=5)
    report = export_model(result.model, result.kinds, result.heads, result.metrics, str(serving), str(artifact),
                          train_pattern, eval_pattern, config)
    return report, serving, artifact


def eval_inputs(trained):
    result, _, eval_pattern, _ = trained
    examples = read_examples(eval_pattern)
    features = {k: v.numpy() for k, v in parse_examples(tf.constant(examples), result.kinds).items()}
    labels = {k: v.numpy() for k, v in parse_examples(tf.constant(examples), label_kinds(result.heads)).items()}
    return examples, features, labels


def test_all_variants_pass_parity_and_are_reported(exported):
    report, serving, artifact = exported
    variants = {v["variant"]: v for v in report["tflite"]}
    assert set(variants) == {"float32", "dynamic_range", "float16", "int8"}
    for name, v in variants.items():
        assert v["passed"], (name, v["problems"])
        assert os.path.getsize(artifact / TFLITE_DIR / f"model_{name}.tflite") == v["size_bytes"]
        assert v["latency_ms"] > 0 and v["examples"] > 50
    # The float32 variant is the same computation; quantized ones are smaller.
    assert variants["float32"]["max_abs_diff"]["scores"] < 1e-4
    assert variants["dynamic_range"]["size_bytes"] < variants["float32"]["size_bytes"]
    assert variants["int8"]["size_bytes"] < variants["float32"]["size_bytes"]
    on_disk = json.loads((artifact / REPORT_JSON).read_text())
    assert on_disk["signatures"]["serving_default"]["inputs"] == {"inputs": {"dtype": "string", "shape": [None]}}
    assert set(on_disk["signatures"]["predict_raw"]["inputs"]) == {"island", "sex", "year", "bill_length_mm",
                                                                     "bill_depth_mm", "flipper_length_mm", "body_mass_g"}
    assert "TFLite int8" in (artifact / REPORT_MD).read_text()


def _shown_signatures(saved_model_dir) -> dict[str, dict]:
    """`saved_model_cli show --all`, TensorFlow's own view: {signature: {"method", "inputs", "outputs"}}."""
    done = subprocess.run([sys.executable, "-m", "tensorflow.python.tools.saved_model_cli", "show", "--dir",
                           str(saved_model_dir), "--all"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    shown, current, side = {}, None, None
    for line in done.stdout.splitlines():
        if match := re.match(r"signature_def\['(.+)'\]:", line):
            current = shown.setdefault(match[1], {"inputs": set(), "outputs": set()})
        elif "contains the following input" in line or "contains the following output" in line:
            side = "inputs" if "input" in line.split("following")[1] else "outputs"
        elif match := re.match(r"\s+(?:inputs|outputs)\['(.+)'\] tensor_info:", line):
            current[side].add(match[1])
        elif line.strip().startswith("Method name is:"):
            current["method"] = line.split(":", 1)[1].strip()
    return shown


def test_signatures_are_tf_servings_as_saved_model_cli_shows_them(exported, trained, tmp_path):
    from tests.serving_helpers import export_model as export_two_heads

    _, serving, _ = exported  # one head: species
    shown = _shown_signatures(serving)
    classify, regress = "tensorflow/serving/classify", "tensorflow/serving/regress"
    assert shown["classify_species"] == {"method": classify, "inputs": {"inputs"}, "outputs": {"classes", "scores"}}
    assert shown["serving_default"] == shown["classify_species"]
    assert shown["predict"] == {"method": "tensorflow/serving/predict", "inputs": {"inputs"},
                                "outputs": {"species_classes", "species_scores"}}
    assert shown["predict_raw"]["outputs"] == {"classes", "scores"}  # as before
    # Two heads (species, body_mass_g): data.label picks the one behind serving_default.
    for label, expected in (("species", "classify_species"), ("body_mass_g", "regress_body_mass_g")):
        both = _shown_signatures(export_two_heads(tmp_path / label, default=label))
        assert both["regress_body_mass_g"] == {"method": regress, "inputs": {"inputs"}, "outputs": {"outputs"}}
        assert both["predict"]["outputs"] == {"species_classes", "species_scores", "body_mass_g_outputs"}
        assert both["serving_default"] == both[expected]
    result = trained[0]
    with pytest.raises(ValueError, match="default head 'nope' is not one of the model's heads"):
        export_saved_model(result.model, result.kinds, result.heads, str(tmp_path / "nope"), default="nope")


def test_the_signatures_share_one_parse_and_one_model_call(exported):
    """Every tf.Example signature calls one traced parse-and-predict function and predict_raw the
    same traced model call: the SavedModel holds the parse once and the model's layers once (a
    load deserializes every saved function), whatever the number of signatures."""
    _, serving, _ = exported
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((serving / "saved_model.pb").read_bytes())
    [meta_graph] = proto.meta_graphs
    assert {"classify_species", "serving_default", "predict", "predict_raw"} <= set(meta_graph.signature_def)
    ops = {f.signature.name: {n.op for n in f.node_def} for f in meta_graph.graph_def.library.function}
    assert len([name for name, used in ops.items() if "ParseExampleV2" in used]) == 1, ops
    assert len([name for name, used in ops.items() if "MatMul" in used]) == 1, ops


def test_the_export_builds_the_parse_and_the_models_call_once(trained, tmp_path, monkeypatch):
    """tf.saved_model.save traces every signature again inside its save context; the parse and
    the model's call the signatures share are concrete functions by then, so neither is built
    again (each was built twice, the graph of every signature with them)."""
    import trainer.export as export

    result = trained[0]
    parses, calls = [], []
    parse, call = export.parse_examples, result.model.call
    monkeypatch.setattr(export, "parse_examples", lambda *args: parses.append(1) or parse(*args))
    monkeypatch.setattr(result.model, "call", lambda *args, **kwargs: calls.append(1) or call(*args, **kwargs))
    export_saved_model(result.model, result.kinds, result.heads, str(tmp_path / "sm"))
    # Built twice each before. The model's call once more at most: ExportArchive walks the tracked
    # model for lookup tables, and Keras traces the model's own default signature on the way.
    assert len(parses) == 1 and len(calls) <= 2, (len(parses), len(calls))


def test_one_converter_makes_each_variant_as_a_converter_of_its_own(exported, trained):
    """export_model converts every variant with one converter (one load of the SavedModel) in the
    order asked (float32 first, int8 last); converted again in the reverse order, every variant is
    the same bytes, so no option of one (int8's ops and samples, float16's types) reaches the next."""
    _, serving, artifact = exported
    result, train_pattern, _, _ = trained
    representative = _parsed_numpy(read_examples(train_pattern, ExportConfig().representative_examples), result.kinds)
    order = ["int8", "float16", "dynamic_range", "float32"]
    converted = tflite.convert_variants(str(serving), order, representative)
    assert list(converted) == order
    for variant, content in converted.items():
        assert content == (artifact / TFLITE_DIR / f"model_{variant}.tflite").read_bytes(), variant
    assert tflite.convert_variants(str(serving), []) == {}


def test_the_converter_uses_the_saved_model_already_loaded(exported, monkeypatch):
    """Given the folder's SavedModel as loaded, the converter loads it no more (TensorFlow's
    converter otherwise loads it when made and in every convert()), makes the same bytes, and
    TensorFlow's loader is back in place after."""
    from tensorflow.lite.python import lite

    _, serving, artifact = exported
    loads = []
    original = lite._load

    def counted(*args, **kwargs):
        loads.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(lite, "_load", counted)
    variants = ["float32", "dynamic_range"]
    alone = tflite.convert_variants(str(serving), variants)
    assert len(loads) == 1 + len(variants)  # what the reuse saves
    loads.clear()
    reused = tflite.convert_variants(str(serving), variants, loaded=tf.saved_model.load(str(serving)))
    assert loads == []
    assert lite._load is counted
    assert reused == alone
    for variant, content in reused.items():
        assert content == (artifact / TFLITE_DIR / f"model_{variant}.tflite").read_bytes(), variant


def test_string_inputs_convert_to_builtins_and_match(exported, trained):
    _, serving, artifact = exported
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(artifact / TFLITE_DIR / "model_float32.tflite"))
    ops = {op["op_name"] for op in interpreter._get_ops_details()}
    assert not any(op.startswith("Flex") or op == "CUSTOM" for op in ops), ops
    assert "EQUAL" in ops  # the string one-hot
    # Missing values (NaN numbers, empty strings) and an unseen island take the same path.
    features = {k: np.array([[b""]], object) if k in ("island", "sex") else np.array([[np.nan]], np.float32)
                for k in trained[0].kinds}
    features["island"] = np.array([[b"Atlantis"]], object)
    lite = tflite.run_tflite((artifact / TFLITE_DIR / "model_float32.tflite").read_bytes(), features)
    saved = tflite.run_saved_model(tf.saved_model.load(str(serving)).signatures["predict_raw"], features)
    np.testing.assert_allclose(lite["scores"], saved["scores"], atol=1e-5)
    assert list(lite["classes"][0]) == list(saved["classes"][0])
    # An infinite number reads as missing too, in both.
    features["bill_length_mm"] = np.array([[-np.inf]], np.float32)
    model_bytes = (artifact / TFLITE_DIR / "model_float32.tflite").read_bytes()
    np.testing.assert_allclose(tflite.run_tflite(model_bytes, features)["scores"], lite["scores"], atol=1e-6)
    signature = tf.saved_model.load(str(serving)).signatures["predict_raw"]
    np.testing.assert_allclose(tflite.run_saved_model(signature, features)["scores"], saved["scores"], atol=1e-6)


def test_warmup_requests_replay_on_the_saved_model(exported):
    _, serving, _ = exported
    logs = read_warmup(str(serving))
    assert [log.WhichOneof("log_type") for log in logs] == ["classify_log", "predict_log", "predict_log"]
    classify = logs[0].classify_log.request
    assert classify.model_spec.signature_name == "serving_default" and len(classify.input.example_list.examples) == 8
    assert [log.predict_log.request.model_spec.signature_name for log in logs[1:]] == ["predict", "predict_raw"]
    loaded = tf.saved_model.load(str(serving))
    answers = []
    for log in logs[1:]:
        request = log.predict_log.request
        inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
        answers.append(loaded.signatures[request.model_spec.signature_name](**{k: tf.constant(v) for k, v in inputs.items()}))
    assert answers[0]["species_scores"].shape[0] == 8
    # The two requests hold the same rows: the two signatures must agree on them.
    np.testing.assert_allclose(answers[0]["species_scores"].numpy(), answers[1]["scores"].numpy(), atol=1e-6)


def test_exported_metrics_match_training_evaluation(exported, trained):
    result, _, eval_pattern, _ = trained
    _, serving, _ = exported
    metrics = evaluate_saved_model(str(serving), read_examples(eval_pattern))
    assert metrics["species_accuracy"] == pytest.approx(result.metrics["species_accuracy"], abs=1e-6)
    assert metrics["loss"] == pytest.approx(result.metrics["loss"], rel=1e-4)


def test_parity_gate_catches_corrupted_weights(exported, trained):
    _, serving, artifact = exported
    result = trained[0]
    content = bytearray((artifact / TFLITE_DIR / "model_float32.tflite").read_bytes())
    # Overwrite the first hidden layer's kernel inside the flatbuffer (TFLite stores it transposed):
    # the file still loads and runs, and computes garbage.
    kernel = np.ascontiguousarray(result.model.get_layer("hidden_0").kernel.numpy().T, np.float32).tobytes()
    at = bytes(content).find(kernel[:64])
    assert at > 0
    content[at:at + len(kernel)] = np.full(len(kernel) // 4, 7.0, np.float32).tobytes()
    examples, features, labels = eval_inputs(trained)
    reference = tflite.run_saved_model(tf.saved_model.load(str(serving)).signatures["predict_raw"], features)
    report = tflite.check_variant("float32", bytes(content), reference, features, labels, result.heads, 1e-4, 1e-6)
    assert not report.passed
    assert report.max_abs_diff["scores"] > 0.01
    assert "scores" in report.problems[0]


def test_parity_gate_catches_a_truncated_flatbuffer(exported, trained):
    _, serving, artifact = exported
    content = (artifact / TFLITE_DIR / "model_float32.tflite").read_bytes()
    _, features, labels = eval_inputs(trained)
    reference = tflite.run_saved_model(tf.saved_model.load(str(serving)).signatures["predict_raw"], features)
    report = tflite.check_variant("float32", content[: len(content) // 2], reference, features, labels,
                                  trained[0].heads, 1e-4, 1e-6)
    assert not report.passed and "does not run in LiteRT" in report.problems[0]


def test_export_fails_with_figures_when_a_required_variant_is_over_tolerance(trained, tmp_path):
    result, train_pattern, eval_pattern, _ = trained
    # dynamic-range quantization cannot be exact: a zero tolerance must fail the export when required.
    config = ExportConfig(tflite_variants=["dynamic_range"], output_tolerance={"dynamic_range": 0.0}, latency_runs=1,
                          required_variants=["dynamic_range"])
    with pytest.raises(tflite.ParityError, match=r"dynamic_range: output 'scores' max abs diff .* > tolerance 0"):
        export_model(result.model, result.kinds, result.heads, result.metrics, str(tmp_path / "Format-Serving"),
                     str(tmp_path), train_pattern, eval_pattern, config)
    report = json.loads((tmp_path / REPORT_JSON).read_text())
    assert report["tflite"][0]["passed"] is False


def test_a_variant_that_is_not_required_is_dropped(trained, tmp_path):
    result, train_pattern, eval_pattern, _ = trained
    config = ExportConfig(tflite_variants=["float32", "dynamic_range"], output_tolerance={"dynamic_range": 0.0}, latency_runs=1)
    report = export_model(result.model, result.kinds, result.heads, result.metrics, str(tmp_path / "Format-Serving"),
                          str(tmp_path), train_pattern, eval_pattern, config)
    by_variant = {v["variant"]: v for v in report["tflite"]}
    assert by_variant["dynamic_range"]["dropped"] and not by_variant["dynamic_range"]["passed"]
    assert by_variant["float32"]["passed"] and not by_variant["float32"]["dropped"]
    assert sorted(p.name for p in (tmp_path / TFLITE_DIR).iterdir()) == ["model_float32.tflite"]
    assert "DROPPED: output" in (tmp_path / "export_report.md").read_text()


def test_mixed_precision_model_exports_in_float32(trained, tmp_path):
    result = trained[0]
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        from trainer.linear_part import LinearFit
        from trainer.model import ModelContext, build_tabular_model

        # The trained model's linear part (trainer.linear_part), read back from its layers.
        inputs = result.model.get_layer("linear_inputs")
        part = LinearFit(inputs.width, inputs.log_columns, inputs.means, inputs.stds, inputs.log_means, inputs.log_stds,
                         {h.name: tuple(result.model.get_layer(f"{h.name}_linear").get_weights()) for h in result.heads})
        mixed = build_tabular_model(ModelContext(result.kinds, result.stats, result.heads, linear=part))
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    assert mixed.get_layer("hidden_0").compute_dtype == "bfloat16"
    mixed.set_weights(result.model.get_weights())
    copy = float32_model(mixed)
    assert {layer.compute_dtype for layer in copy.layers if layer.weights} == {"float32"}
    for a, b in zip(copy.get_weights(), result.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    content = None
    export_saved_model(copy, result.kinds, result.heads, str(tmp_path / "sm"))
    content = tflite.convert_variants(str(tmp_path / "sm"), ["float32"])["float32"]
    assert len(content) > 1000


def test_parity_gate_catches_unfrozen_variables(trained, tmp_path):
    """A hand-rolled tf.Module export whose function closes over the Keras variables converts
    with READ_VARIABLE ops that read garbage; the gate must refuse it."""
    result = trained[0]
    model = result.model
    from trainer.export import named_outputs, raw_input_spec

    module = tf.Module()
    module.model = model
    module.serve = tf.function(lambda features: named_outputs(result.heads, model(features, training=False)),
                               input_signature=[raw_input_spec(result.kinds)])
    path = str(tmp_path / "hand_rolled")
    tf.saved_model.save(module, path, signatures={"predict_raw": module.serve})
    _, features, labels = eval_inputs(trained)
    reference = tflite.run_saved_model(tf.saved_model.load(path).signatures["predict_raw"], features)
    content = tflite.convert_variants(path, ["float32"])["float32"]
    report = tflite.check_variant("float32", content, reference, features, labels, result.heads, 1e-4, 1e-6)
    assert not report.passed, report.max_abs_diff
    assert report.max_abs_diff.get("scores", 0) > 0.01 or "does not run" in report.problems[0], report.problems
