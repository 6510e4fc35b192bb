"""The export report and TFLite variants of a SavedModel loopline did not export (a TFX run_fn's):
trainer.foreign_export, on small SavedModels written here."""
import json

import tensorflow as tf

from trainer.export_config import ExportConfig
from trainer.foreign_export import export_foreign


def _examples(tmp_path, rows: int = 20) -> str:
    path = tmp_path / "eval.tfrecord.gz"  # GZIP, as ExampleGen writes its splits
    with tf.io.TFRecordWriter(str(path), options="GZIP") as writer:
        for i in range(rows):
            example = tf.train.Example()
            example.features.feature["x"].float_list.value.append(float(i))
            writer.write(example.SerializeToString())
    return str(path)


def _save(tmp_path, name: str, function) -> str:
    module = tf.Module()
    module.serve = tf.function(function, input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    path = str(tmp_path / name)
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    return path


def test_a_signature_that_parses_tf_examples_is_dropped_naming_the_ops_tflite_lacks(tmp_path):
    """Parsing tf.Examples is not among TFLite's builtin ops: every variant is dropped, the report
    says which ops, and the run is not failed (float32 is required by default)."""
    def parse(examples):
        return {"doubled": 2.0 * tf.io.parse_example(examples, {"x": tf.io.FixedLenFeature([1], tf.float32)})["x"]}

    model = _save(tmp_path, "parsing", parse)
    pattern = _examples(tmp_path)
    report = export_foreign(model, str(tmp_path / "artifact"), "serving_default", pattern, pattern, {"loss": 0.5},
                            ExportConfig(tflite_variants=["float32", "dynamic_range"]))
    assert [v["variant"] for v in report["tflite"]] == ["float32", "dynamic_range"]
    for variant in report["tflite"]:
        assert variant["dropped"] and not variant["passed"] and variant["path"] is None
        assert "ParseExampleV2" in variant["problems"][0]
    written = json.loads((tmp_path / "artifact" / "export_report.json").read_text())
    assert written["tflite"] == report["tflite"] and written["metrics"] == {"loss": 0.5}
    assert "DROPPED: not convertible with TFLite's builtin ops" in (tmp_path / "artifact" / "export_report.md").read_text()
    assert not (tmp_path / "artifact" / "Format-TFLite").exists()


def test_a_convertible_signature_is_converted_and_checked_against_the_saved_model(tmp_path):
    """A signature of builtin ops only (here it hands the serialized examples back): converted,
    run in LiteRT on the eval examples, equal to the SavedModel's answers, its file kept."""
    model = _save(tmp_path, "echo", lambda examples: {"echo": tf.identity(examples)})
    pattern = _examples(tmp_path)
    report = export_foreign(model, str(tmp_path / "artifact"), "serving_default", pattern, pattern, {},
                            ExportConfig(tflite_variants=["float32"], latency_runs=2))
    (variant,) = report["tflite"]
    assert variant["passed"] and not variant["dropped"], variant["problems"]
    assert variant["examples"] == 20 and variant["max_abs_diff"] == {"echo": 0.0}
    assert (tmp_path / "artifact" / "Format-TFLite" / "model_float32.tflite").stat().st_size == variant["size_bytes"] > 0
    assert report["saved_model"]["latency_ms"] > 0


def test_a_signature_not_taking_serialized_examples_has_no_parity_examples(tmp_path):
    module = tf.Module()
    module.serve = tf.function(lambda x: {"y": x * 2.0}, input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    path = str(tmp_path / "floats")
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    pattern = _examples(tmp_path)
    report = export_foreign(path, str(tmp_path / "artifact"), "serving_default", pattern, pattern, {},
                            ExportConfig(tflite_variants=["float32"]))
    assert report["tflite"][0]["dropped"]
    assert "not one input of serialized tf.Examples" in report["tflite"][0]["problems"][0]
