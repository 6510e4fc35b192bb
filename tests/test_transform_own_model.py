"""A Transform step in front of loopline's own model (trainer.transform_graph): the default
multi-task penguins module trains on examples/penguins/preprocessing.py's outputs, and its
signatures take the raw columns and run the transform graph first. One real `loopline run` (a
child process) shared by the tests."""
import glob
import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import REPO, loopline_run_child

MODULE_FILE = REPO / "examples" / "penguins" / "preprocessing.py"
# What the preprocessing_fn reads, less what the model predicts (species, body_mass_g: the default
# module's labels) and what nothing reads (year).
RAW_INPUTS = {"bill_length_mm", "bill_depth_mm", "flipper_length_mm", "island", "sex"}


@pytest.fixture(scope="module")
def transform_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("transform_own")
    overrides = [f"transform.module_file={MODULE_FILE}"]
    return loopline_run_child(root, *overrides)


def _one(pattern: str) -> str:
    (path,) = glob.glob(pattern)
    return path


def _eval_records(config) -> list[bytes]:
    pattern = f"{config.pipeline.root}/tfx/CsvExampleGen/examples/*/Split-eval/*"
    return [r.numpy() for r in tf.data.TFRecordDataset(tf.io.gfile.glob(pattern), compression_type="GZIP")]


@pytest.mark.slow
def test_the_model_trains_on_transformed_examples_and_is_served_raw_ones_without_skew(transform_run):
    """The Trainer's figures are on the Transform's eval examples; the Evaluator's on the raw eval
    examples through the exported signature (parse, transform graph, model). Equal figures: the
    graph served is the one trained on. An output computed from a label (body_mass_g_z) is no
    input: the signatures do not ask for body_mass_g."""
    config, summary = transform_run
    assert summary.executions["Transform"] == summary.executions["Trainer"] == "COMPLETE"
    assert summary.blessed is True
    root = config.pipeline.root
    trained = json.loads(Path(_one(f"{root}/tfx/Trainer/model_run/*/metrics.json")).read_text())
    evaluated = json.loads(Path(_one(f"{root}/tfx/Evaluator/blessing/*/blessing.json")).read_text())["candidate"]
    for metric in ("species_loss", "species_accuracy", "body_mass_g_loss"):
        assert evaluated[metric] == pytest.approx(trained[metric], rel=1e-5), metric
    assert trained["species_examples"] == evaluated["species_examples"] == len(_eval_records(config))

    loaded = tf.saved_model.load(summary.pushed_path)
    assert set(loaded.signatures["predict_raw"].structured_input_signature[1]) == RAW_INPUTS
    assert loaded.signatures["serving_default"].structured_input_signature[1].keys() == {"inputs"}


@pytest.mark.slow
def test_raw_tensors_and_raw_examples_get_the_same_answers_missing_values_included(transform_run):
    """predict_raw (one tensor per raw column, a missing value NaN or empty) and serving_default
    (serialized tf.Examples, a missing value absent) feed the graph the same rows."""
    from trainer.features import kinds_from_schema, parse_examples
    from validation.schema import load_schema

    config, summary = transform_run
    records = _eval_records(config)
    missing_sex = [r for r in records if not tf.train.Example.FromString(r).features.feature["sex"].bytes_list.value]
    assert missing_sex, "the bundled eval split holds rows without sex"
    loaded = tf.saved_model.load(summary.pushed_path)
    schema = _one(f"{config.pipeline.root}/tfx/SchemaGen/schema/*")
    kinds = {k: v for k, v in kinds_from_schema(load_schema(schema)).items() if k in RAW_INPUTS}
    raw = parse_examples(tf.constant(records), kinds)
    by_tensors = loaded.signatures["predict_raw"](**raw)
    by_examples = loaded.signatures["serving_default"](inputs=tf.constant(records))
    np.testing.assert_allclose(by_tensors["scores"].numpy(), by_examples["scores"].numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_the_served_model_answers_raw_examples_over_grpc_as_the_saved_model_does(transform_run):
    """The transform graph's vocabulary tables load in the server (a TensorFlow 1 Session, as TF
    Serving loads a model) and answer as the SavedModel called directly."""
    from tests.serving_helpers import predict_examples

    config, summary = transform_run
    records = _eval_records(config)[:32]
    direct = tf.saved_model.load(summary.pushed_path).signatures["serving_default"](inputs=tf.constant(records))
    answer = predict_examples(Path(config.pipeline.root), config.serving.model_name, records, input_name="inputs")
    assert answer.model_spec.version.value == int(summary.version)
    np.testing.assert_allclose(tf.make_ndarray(answer.outputs["scores"]), direct["scores"].numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_tflite_variants_the_graph_s_ops_rule_out_are_dropped_with_the_ops_named(transform_run):
    """The vocabulary lookups (StringToHashBucketFast) are beyond TFLite's builtins: every variant,
    the required float32 too, is dropped with the ops named, and the run goes on."""
    config, summary = transform_run
    report = json.loads(Path(_one(f"{config.pipeline.root}/tfx/Trainer/model/*/export_report.json")).read_text())
    assert [v["variant"] for v in report["tflite"]] == list(config.export.tflite_variants)
    for variant in report["tflite"]:
        assert variant["dropped"] and "StringToHashBucketFast" in variant["problems"][0], variant


@pytest.mark.slow
def test_a_label_the_graph_drops_or_changes_is_refused_naming_it(transform_run):
    from trainer.transform_graph import InputTransform, TransformError, _check_labels_pass_through

    config, _ = transform_run
    graph = _one(f"{config.pipeline.root}/tfx/Transform/transform_graph/*")
    records = _eval_records(config)[:50]
    kinds = {"island": "string", "year": "int64", "species": "string"}
    with pytest.raises(TransformError, match=r"no output 'year'.*outputs\['year'\] = inputs\['year'\]"):
        InputTransform(graph, kinds, ["year"], records)

    def upper_species(features):
        return {"species": tf.strings.upper(features["species"])}

    spec = {"species": tf.io.FixedLenFeature([1], tf.string)}
    with pytest.raises(TransformError, match=r"output 'species' is not its input 'species'"):
        _check_labels_pass_through(upper_species, spec, ["species"], tf.constant(records))


@pytest.mark.slow
def test_loopline_s_search_tunes_on_the_transformed_examples(transform_run, monkeypatch, tmp_path):
    """tuner.enabled with a Transform: the trials read what the Trainer reads."""
    import components.tuner as tuner_component
    import trainer.tuning
    from tfx.types import standard_artifacts
    from trainer.config import TrainerConfig
    from trainer.tuning import TunerConfig

    config, _ = transform_run

    def artifact(kind, node: str, output: str):
        made = kind()
        made.uri = _one(f"{config.pipeline.root}/tfx/{node}/{output}/*")
        if kind is standard_artifacts.Examples:
            made.split_names = '["train", "eval"]'
        return made

    seen = {}
    monkeypatch.setattr(trainer.tuning, "search", lambda *args, **kwargs: seen.update(pattern=args[2], **kwargs))
    transformed = artifact(standard_artifacts.Examples, "Transform", "transformed_examples")
    tuner_component._loopline_search(
        TunerConfig(enabled=True, search_space={"learning_rate": {"values": [0.01]}}),
        TrainerConfig(module_file=config.trainer.module_file),
        artifact(standard_artifacts.Examples, "CsvExampleGen", "examples"),
        artifact(standard_artifacts.Schema, "SchemaGen", "schema"), "species", "auto", 0, str(tmp_path),
        artifact(standard_artifacts.TransformGraph, "Transform", "transform_graph"), transformed)
    assert seen["pattern"].startswith(transformed.uri)
    assert {"bill_length_mm_z", "island_id", "species"} <= set(seen["kinds"]) and "body_mass_g_z" not in seen["kinds"]


def _write_examples(path: Path, rows: list[dict]) -> str:
    """GZIP tf.Example TFRecords of `rows` (floats and ints), as a split's file pattern."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path), tf.io.TFRecordOptions(compression_type="GZIP")) as writer:
        for row in rows:
            feature = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=np.ravel(v).tolist()))
                       if np.asarray(v).dtype.kind == "i" else
                       tf.train.Feature(float_list=tf.train.FloatList(value=np.ravel(v).tolist()))
                       for k, v in row.items()}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return str(path.parent / "*")


@pytest.mark.slow
def test_a_graph_tflite_s_builtins_run_is_converted_with_the_model_and_parity_gated(tmp_path):
    """z-scores and min-max scaling of always present numbers: the required float32 variant holds
    the graph and the model, and passes the same parity gate as any loopline model."""
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam
    from tensorflow_transform.tf_metadata import dataset_metadata, metadata_io, schema_utils

    from trainer.config import TrainerConfig
    from trainer.export import export_model
    from trainer.export_config import ExportConfig
    from trainer.loop import train
    from trainer.transform_graph import InputTransform

    rng = np.random.default_rng(0)
    rows = [{"x": np.float32(rng.normal(50, 10)), "y": np.float32(rng.uniform(0, 9))} for _ in range(300)]
    for row in rows:
        row["label"] = np.int64(row["x"] + 3 * row["y"] > 62)
    spec = {"x": tf.io.FixedLenFeature([], tf.float32), "y": tf.io.FixedLenFeature([], tf.float32),
            "label": tf.io.FixedLenFeature([], tf.int64)}

    def preprocessing_fn(inputs):
        return {"x_z": tft.scale_to_z_score(inputs["x"]), "y_01": tft.scale_to_0_1(inputs["y"]),
                "label": inputs["label"]}

    with tft_beam.Context(temp_dir=str(tmp_path / "tft_tmp"), force_tf_compat_v1=False):
        metadata = dataset_metadata.DatasetMetadata(schema_utils.schema_from_feature_spec(spec))
        (transformed, transformed_metadata), transform_fn = (
            (rows, metadata) | tft_beam.AnalyzeAndTransformDataset(preprocessing_fn, output_record_batches=False))
        _ = transform_fn | tft_beam.WriteTransformFn(str(tmp_path / "graph"))
    metadata_io.write_metadata(metadata, str(tmp_path / "graph" / "metadata"))  # the raw schema, as TFX's Transform
    raw = {split: _write_examples(tmp_path / "raw" / split / "data.gz", part)
           for split, part in (("train", rows[:200]), ("eval", rows[200:]))}
    done = {split: _write_examples(tmp_path / "transformed" / split / "data.gz", part)
            for split, part in (("train", transformed[:200]), ("eval", transformed[200:]))}

    records = [r.numpy() for r in tf.data.TFRecordDataset(tf.io.gfile.glob(raw["train"]), compression_type="GZIP")]
    transform = InputTransform(str(tmp_path / "graph"), {"x": "float32", "y": "float32", "label": "int64"},
                               ["label"], records)
    assert transform.raw_kinds == {"x": "float32", "y": "float32"}
    result = train(TrainerConfig(epochs=2, batch_size=32, progress="log", tensorboard=False), done["train"],
                   done["eval"], "label", kinds=transform.kinds, label_kind="classification")
    report = export_model(result.model, result.kinds, result.heads, result.metrics, str(tmp_path / "serving"),
                          str(tmp_path / "artifact"), raw["train"], raw["eval"],
                          ExportConfig(tflite_variants=["float32"], latency_runs=2), default="label",
                          transform=transform)
    (variant,) = report["tflite"]
    assert variant["passed"] and not variant["dropped"] and variant["examples"] == 100, variant
    assert set(tf.saved_model.load(str(tmp_path / "serving")).signatures["predict_raw"]
               .structured_input_signature[1]) == {"x", "y"}


@pytest.mark.slow
def test_the_transform_s_vocabulary_indices_are_categories_not_numbers(transform_run):
    """tft's vocabulary outputs (island_id, sex_id) are marked categorical in the transformed
    schema, so the generic encoder one-hot encodes them: the first hidden layer reads 2 columns per
    z-score (value, missing) and one per index value seen, not 2 per index."""
    from trainer.features import kinds_from_schema
    from trainer.transform_graph import InputTransform
    from validation.schema import load_schema

    config, summary = transform_run
    root = config.pipeline.root
    transform = InputTransform(_one(f"{root}/tfx/Transform/transform_graph/*"),
                               kinds_from_schema(load_schema(_one(f"{root}/tfx/SchemaGen/schema/*"))),
                               ["species", "body_mass_g"], _eval_records(config)[:50])
    assert transform.categorical == ["island_id", "sex_id"]
    values = read_transformed(f"{root}/tfx/Transform/transformed_examples/*/Split-train/*", transform.categorical)
    z_scores = [name for name in transform.input_kinds if name.endswith("_z")]
    checkpoint = tf.train.latest_checkpoint(_one(f"{root}/tfx/Trainer/model_run/*/checkpoints"))
    (width,) = {shape[0] for name, shape in tf.train.list_variables(checkpoint)
                if name.startswith("selection/weights/") and len(shape) == 2 and shape[1] == 64}
    assert width == 2 * len(z_scores) + sum(len(set(v)) for v in values.values())


def read_transformed(pattern: str, names: list[str]) -> dict[str, list[int]]:
    spec = {name: tf.io.FixedLenFeature([], tf.int64) for name in names}
    records = tf.data.TFRecordDataset(tf.io.gfile.glob(pattern), compression_type="GZIP")
    parsed = [tf.io.parse_single_example(r, spec) for r in records]
    return {name: [int(p[name]) for p in parsed] for name in names}
