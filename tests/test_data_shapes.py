"""Features of every shape and labels of every kind, on small tf.Examples written here: fixed
shapes, variable-length lists of numbers and strings, encoded PNG images; integer class labels,
the class cap and unseen classes; nothing cut without an error naming the feature."""
from __future__ import annotations

import io
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from trainer.config import TrainerConfig
from trainer.export import export_saved_model
from trainer.export_config import ExportConfig
from trainer.features import compute_stats, infer_feature_kinds, kinds_from_schema, parse_examples
from trainer.heads import UNSEEN_LABEL
from trainer.loop import train
from trainer.model import head_kinds, make_head


def png(pixels: np.ndarray) -> bytes:
    return tf.io.encode_png(pixels.astype(np.uint8)[..., np.newaxis]).numpy()


def example(**features) -> bytes:
    out = tf.train.Example()
    for name, values in features.items():
        values = list(np.asarray(values).reshape(-1)) if not isinstance(values, list) else values
        feature = out.features.feature[name]
        if values and isinstance(values[0], (bytes, str)):
            feature.bytes_list.value.extend(v.encode() if isinstance(v, str) else v for v in values)
        elif values and isinstance(values[0], (int, np.integer)):
            feature.int64_list.value.extend(int(v) for v in values)
        else:
            feature.float_list.value.extend(float(v) for v in values)
    return out.SerializeToString()


def write(path: str, records: list[bytes]) -> str:
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for record in records:
            writer.write(record)
    return path


def shaped_rows(rng: np.random.Generator, count: int, classes: int = 3) -> list[bytes]:
    """The class (an int64 0..classes-1) shows in every feature: a bright 4x4 image quadrant, the
    mean of a 2x3 grid, the length of a number list and a word in a string list."""
    rows = []
    for _ in range(count):
        label = int(rng.integers(classes))
        image = rng.integers(0, 40, (4, 4))
        image[label % 2 * 2:label % 2 * 2 + 2, label // 2 * 2:label // 2 * 2 + 2] = 250
        rows.append(example(
            image=[png(image)],
            grid=(rng.normal(size=(2, 3)) + label).astype(np.float32),
            numbers=rng.normal(size=label + 1).astype(np.float32),
            words=[f"w{label}", "common"][: 1 + int(rng.integers(2))],
            label=[label],
        ))
    return rows


@pytest.fixture(scope="module")
def shaped(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("shaped"))
    rng = np.random.default_rng(0)
    return (write(os.path.join(folder, "train.gz"), shaped_rows(rng, 192)),
            write(os.path.join(folder, "eval.gz"), shaped_rows(rng, 48)))


def test_kinds_are_inferred_with_their_shapes(shaped):
    kinds = infer_feature_kinds(shaped[0])
    assert kinds == {"grid": "float32[6]", "image": "image[4,4,1]", "label": "int64",
                     "numbers": "float32[:3]", "words": "string[:2]"}
    records = [r for r in tf.data.TFRecordDataset(shaped[0], "GZIP").take(4).as_numpy_iterator()]
    parsed = parse_examples(tf.constant(records), {**kinds, "grid": "float32[2,3]"})
    assert parsed["grid"].shape == (4, 2, 3)
    assert parsed["image"].shape == (4, 4, 4, 1) and float(tf.reduce_max(parsed["image"])) == pytest.approx(250 / 255)
    assert parsed["numbers"].shape == (4, 3) and parsed["words"].shape == (4, 2)
    lengths = np.isfinite(parsed["numbers"].numpy()).sum(axis=1)  # the rest padded as missing
    assert list(lengths - 1) == list(parsed["label"].numpy()[:, 0].astype(int))


@pytest.mark.parametrize("kind, values, problem", [
    ("float32", [1.0, 2.0], "more than 1 value"),  # a scalar column holding a list
    ("float32[:2]", [1.0, 2.0, 3.0], "more than 2 value"),
    ("float32[2,2]", [1.0, 2.0, 3.0], "another count than 4"),
])
def test_nothing_is_cut_silently(kind, values, problem):
    records = tf.constant([example(x=[1.0]), example(**{"sepal length (cm)": values})])
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"feature 'sepal length \(cm\)'.*{problem}"):
        parse_examples(records, {"sepal length (cm)": kind})


def test_columns_checked_together_name_only_the_ones_that_break_their_kind():
    """Columns held to one limit share one check in the graph (a served request runs every op);
    it names the columns that break it and no other, and a batch that keeps it parses whole."""
    kinds = {"a": "float32", "b": "float32", "w": "string", "pair": "float32[2]", "grid": "float32[2,2]"}
    parse = tf.function(lambda serialized: parse_examples(serialized, kinds))
    good = example(a=[1.0], b=[2.0], w=[b"x"], pair=[1.0, 2.0], grid=[1.0, 2.0, 3.0, 4.0])
    parsed = parse(tf.constant([good, example(grid=[])]))
    assert parsed["pair"].shape == (2, 2) and np.isnan(parsed["a"].numpy()[1, 0]) and parsed["w"].numpy()[1, 0] == b""

    def problems(*records) -> str:
        with pytest.raises(tf.errors.InvalidArgumentError) as raised:
            parse(tf.constant([good, *records]))
        return str(raised.value).splitlines()[0]

    def named(column: str, message: str) -> bool:
        return re.search(rf"feature \W*{column}\W* \(", message) is not None

    one = problems(example(b=[1.0, 2.0]))
    assert re.search(r"feature \W*b\W* \(float32\): an example holds more than 1 value", one)
    assert not any(named(c, one) for c in ("a", "w", "pair", "grid")), one
    both = problems(example(a=[1.0, 2.0]), example(w=[b"x", b"y"]))
    assert named("a", both) and named("w", both) and not named("b", both), both
    fixed = problems(example(grid=[1.0, 2.0, 3.0]))
    assert re.search(r"feature \W*grid\W* \(float32\[2,2\]\): an example holds another count than 4", fixed)
    assert not named("pair", fixed), fixed


def test_the_parse_reshapes_only_columns_of_more_dimensions():
    """A reshape that changes nothing still costs its ops in every graph, per column (a trace of
    the parse at 110 columns took about a third less without them). The encoder keeps its own:
    it turns a served `[batch]` feed into `[batch, 1]` (tests/test_serving.py)."""
    kinds = {"a": "float32", "n": "int64", "w": "string[:3]", "grid": "float32[2,2]"}
    made_by = {}

    def parse(serialized):
        parsed = parse_examples(serialized, kinds)
        made_by.update({name: tensor.op.type for name, tensor in parsed.items()})
        return parsed

    tf.function(parse, autograph=False).get_concrete_function(tf.TensorSpec([None], tf.string))
    assert made_by == {"a": "RaggedTensorToTensor", "n": "RaggedTensorToTensor", "w": "RaggedTensorToTensor",
                       "grid": "Reshape"}


def test_an_image_of_another_size_is_an_error_naming_the_feature():
    records = tf.constant([example(photo=[png(np.zeros((4, 4)))]), example(photo=[png(np.zeros((5, 4)))])])
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 'photo': an image is not 4x4"):
        parse_examples(records, {"photo": "image[4,4,1]"})


def test_two_images_in_one_example_are_an_error_naming_the_feature():
    one = png(np.zeros((4, 4)))
    parse = tf.function(lambda serialized: parse_examples(serialized, {"photo": "image[4,4,1]", "x": "float32"}))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"feature \W*photo\W*: an example holds more than one image"):
        parse(tf.constant([example(photo=[one], x=[1.0]), example(photo=[one, one], x=[2.0])]))


def test_schema_shapes_lists_and_image_domain_give_kinds():
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2

    schema = text_format.Parse("""
        feature { name: "pixels" type: FLOAT shape { dim { size: 8 } dim { size: 8 } } }
        feature { name: "tags" type: BYTES value_count { min: 0 max: 7 } }
        feature { name: "photo" type: BYTES image_domain {} }
        feature { name: "age" type: INT value_count { min: 1 max: 1 } }
    """, schema_pb2.Schema())
    assert kinds_from_schema(schema) == {"age": "int64", "photo": "image", "pixels": "float32[8,8]",
                                         "tags": "string[:7]"}


def test_every_shape_trains_and_exports(shaped, tmp_path):
    """Integer labels declared classification; the export's serving_default decodes the PNGs in
    the graph and predict_raw takes the decoded image."""
    config = TrainerConfig(epochs=12, batch_size=32, learning_rate=0.01, tensorboard=False)
    result = train(config, *shaped, "label", label_kind="classification")
    head = result.heads[0]
    assert head.kind == "classification" and head.vocabulary == ["0", "1", "2"]
    assert result.metrics["label_accuracy"] > 0.9
    assert result.metrics["label_unseen_label_examples"] == 0
    export_dir = export_saved_model(result.model, result.kinds, result.heads, str(tmp_path / "export"), "label")
    loaded = tf.saved_model.load(export_dir)
    records = [r for r in tf.data.TFRecordDataset(shaped[1], "GZIP").take(8).as_numpy_iterator()]
    served = loaded.signatures["serving_default"](inputs=tf.constant(records))
    raw_inputs = parse_examples(tf.constant(records), result.kinds)
    raw = loaded.signatures["predict_raw"](**raw_inputs)
    assert raw_inputs["image"].shape == (8, 4, 4, 1)
    np.testing.assert_allclose(served["scores"].numpy(), raw["scores"].numpy(), rtol=1e-5, atol=1e-6)

    # The MLflow pyfunc: a DataFrame with image bytes and lists per cell gives the same answers.
    import pandas as pd
    from types import SimpleNamespace

    from tracking.pyfunc_model import SavedModelPyfunc

    parsed = [tf.train.Example.FromString(r).features.feature for r in records]
    frame = pd.DataFrame({
        "image": [f["image"].bytes_list.value[0] for f in parsed],
        "grid": [list(f["grid"].float_list.value) for f in parsed],
        "numbers": [list(f["numbers"].float_list.value) for f in parsed],
        "words": [[w.decode() for w in f["words"].bytes_list.value] for f in parsed],
    })
    pyfunc = SavedModelPyfunc()
    pyfunc.load_context(SimpleNamespace(artifacts={"saved_model": export_dir}))
    answers = pyfunc.predict(None, frame)
    np.testing.assert_allclose(answers[[f"label_score_{c}" for c in head.vocabulary]].to_numpy(),
                               served["scores"].numpy(), rtol=1e-5, atol=1e-6)


def test_label_kind_rules():
    kinds = {"n": "int64", "s": "string", "v": "float32[:3]"}
    assert head_kinds(["n", "s"], kinds, {}, "auto") == {"n": "regression", "s": "classification"}
    assert head_kinds(["n"], kinds, {}, "classification") == {"n": "classification"}
    assert head_kinds(["n"], kinds, {"n": "classification"}, "auto") == {"n": "classification"}
    with pytest.raises(ValueError, match="label 'n': the model module declares regression, but data.label_kind is classification"):
        head_kinds(["n"], kinds, {"n": "regression"}, "classification")
    with pytest.raises(ValueError, match="label 's': data.label_kind is regression, but the data holds strings"):
        head_kinds(["s"], kinds, {}, "regression")
    with pytest.raises(ValueError, match="label 'v' is a float32\\[:3\\] feature"):
        head_kinds(["v"], kinds, {}, "auto")


def test_no_silent_class_cap_and_max_classes_counts_what_it_drops(caplog):
    labels = np.array([[f"c{i:03d}"] for i in range(150)] + [["c000"]] * 10, dtype=object)
    stats = compute_stats([{"y": labels.astype(bytes)}], {"y": "string"}, classes=["y"])
    assert len(make_head("y", "string", stats, "classification").vocabulary) == 150
    capped = make_head("y", "string", stats, "classification", max_classes=100)
    assert len(capped.vocabulary) == 100 and "c000" in capped.vocabulary
    assert "50 training row(s) of the other classes are left out" in caplog.text
    # A text feature of many values is looked up whole (ColumnEmbeddings), not capped.
    words = compute_stats([{"words": labels.astype(bytes)}], {"words": "string"})
    assert len(words.lookups["words"]) == 150 and "words" not in words.strings and "feature 'words'" not in caplog.text
    # A list of strings is multi-hot: capped, and said so.
    compute_stats([{"tags": labels.astype(bytes)}], {"tags": "string[:1]"})
    assert "feature 'tags': 150 distinct values; the generic encoder one-hot encodes the 100 most frequent" in caplog.text


def test_unseen_eval_class_is_counted_apart_from_missing():
    from trainer.heads import Head, HeadTotals

    head = Head("y", "classification", vocabulary=["1", "2"], label_dtype="int64")
    targets = head.encode_label(tf.constant([[1.0], [2.0], [7.0], [np.nan], [1.5]]))
    assert targets.numpy().tolist() == [0, 1, UNSEEN_LABEL, -1, UNSEEN_LABEL]
    totals = HeadTotals([head])
    totals.add({"y": targets}, {"y": tf.constant([[0.9, 0.1]] * 5)})
    metrics = totals.metrics()
    assert metrics["y_unseen_label_examples"] == 2 and metrics["y_examples"] == 2
    assert metrics["y_accuracy"] == 0.5


def test_column_names_of_every_kind_work_end_to_end(tmp_path):
    """Spaces, parentheses, dots, dashes and non-ASCII letters: one rule names the inputs and
    heads; the mapping is in loopline_signature.json; the pyfunc takes the original names."""
    import json
    from types import SimpleNamespace

    import pandas as pd

    from serving.signature_names import signature_names_of
    from tracking.pyfunc_model import SavedModelPyfunc

    rng = np.random.default_rng(1)

    def rows(n):
        out = []
        for _ in range(n):
            y = int(rng.integers(2))
            out.append(example(**{"sepal length (cm)": [float(3 * y + rng.normal())], "pétale.größe-x": [f"v{y}"],
                                  "class name": [f"k{y}"]}))
        return out

    train_file = write(str(tmp_path / "t.gz"), rows(128))
    eval_file = write(str(tmp_path / "e.gz"), rows(32))
    result = train(TrainerConfig(epochs=3, batch_size=32, tensorboard=False), train_file, eval_file, "class name")
    assert result.heads[0].name == "class_name" and result.heads[0].label_column == "class name"
    assert result.metrics["class_name_accuracy"] > 0.9
    export_dir = export_saved_model(result.model, result.kinds, result.heads, str(tmp_path / "export"), "class name")
    raw = tf.saved_model.load(export_dir).signatures["predict_raw"]
    assert sorted(raw.structured_input_signature[1]) == ["petale_groe_x", "sepal_length_cm"]
    description = json.loads((tmp_path / "export/assets.extra/loopline_signature.json").read_text())
    assert description["signature_names"] == {"class name": "class_name", "pétale.größe-x": "petale_groe_x",
                                              "sepal length (cm)": "sepal_length_cm"}
    pyfunc = SavedModelPyfunc()
    pyfunc.load_context(SimpleNamespace(artifacts={"saved_model": export_dir}))
    answers = pyfunc.predict(None, pd.DataFrame({"sepal length (cm)": [0.0, 3.0], "pétale.größe-x": ["v0", "v1"]}))
    assert list(answers["class_name"]) == ["k0", "k1"]
    with pytest.raises(ValueError, match="columns 'a b' and 'a-b' both become 'a_b'"):
        signature_names_of(["a b", "a-b"])


def test_statistics_and_schema_record_lists_and_images_as_tfdv(shaped, tmp_path):
    from tensorflow_metadata.proto.v0 import statistics_pb2

    from validation.anomalies import check_drift, validate_split
    from validation.config import ValidationConfig
    from validation.schema import infer_schema
    from validation.statistics import compute_statistics

    stats = compute_statistics(shaped[0], "train")
    by_name = {f.name: f for f in stats.features}
    image = by_name["image"]
    assert image.type == statistics_pb2.FeatureNameStatistics.BYTES and image.bytes_stats.max_num_bytes > 0
    assert [c.str for c in image.custom_stats if c.name == "domain_info"] == ["image_domain {}"]
    assert not image.string_stats.rank_histogram.buckets  # no rank histogram of blobs
    numbers = by_name["numbers"].num_stats.common_stats
    assert (numbers.min_num_values, numbers.max_num_values) == (1, 3)
    schema = infer_schema(stats, ValidationConfig())
    features = {f.name: f for f in schema.feature}
    assert features["image"].HasField("image_domain") and not features["image"].HasField("domain")
    assert [d.size for d in features["grid"].shape.dim] == [6]
    assert (features["numbers"].value_count.min, features["numbers"].value_count.max) == (1, 3)
    assert kinds_from_schema(schema) == {**infer_feature_kinds(shaped[0]), "image": "image"}

    longer = write(str(tmp_path / "longer.gz"), [example(image=[png(np.full((4, 4), 9))], grid=np.zeros(6, np.float32),
                                                         numbers=np.zeros(5, np.float32), words=["w0"], label=[0])] * 4)
    new_stats = compute_statistics(longer, "eval")
    _, problems = validate_split("eval", new_stats, schema, ValidationConfig())
    assert [(p.feature, p.kind) for p in problems] == [("numbers", "FEATURE_TYPE_HIGH_NUMBER_VALUES")]
    from tensorflow_metadata.proto.v0 import anomalies_pb2

    drift = anomalies_pb2.Anomalies()
    check_drift("eval", new_stats, stats, schema, ValidationConfig(), drift)
    measured = {info.path.step[0] for info in drift.drift_skew_info}
    assert "image" not in measured and "label" in measured


HOOKS = '''
import keras
import tensorflow as tf

LABELS = {"label": "classification"}


def preprocess(features):
    return {**features, "grid": tf.zeros_like(features["grid"]) + 7.0}  # the model sees 7s only


def augment(features, labels, rng):
    noise = tf.random.stateless_uniform([2], seed=rng)
    return {**features, "numbers": tf.zeros_like(features["numbers"]) + 1000.0 + noise[0]}, labels
'''


def test_preprocess_runs_in_the_exported_graph_and_augment_on_training_batches_only(shaped, tmp_path):
    from trainer.config import InputConfig
    from trainer.features import compute_stats
    from trainer.inputs import parsed_batches, training_stream
    from trainer.model import ModelContext, build_model, load_module

    module_file = tmp_path / "hooks.py"
    module_file.write_text(HOOKS)
    module = load_module(str(module_file))
    kinds = infer_feature_kinds(shaped[0])
    stats = compute_stats(parsed_batches(shaped[0], kinds), kinds, classes=["label"])
    heads = [make_head("label", "int64", stats, "classification")]
    inputs = {k: v for k, v in kinds.items() if k != "label"}

    stream = lambda skip: training_stream(shaped[0], kinds, heads, 16, InputConfig(), seed=3, skip_batches=skip,
                                          augment=module.augment)
    batches = [features["numbers"].numpy() for features, _ in stream(0).take(3)]
    assert all(np.all((b >= 1000) & (b < 1001)) for b in batches)
    assert batches[0][0, 0] != batches[1][0, 0]  # a seed per batch
    resumed = next(iter(stream(2)))[0]["numbers"].numpy()
    np.testing.assert_array_equal(resumed, batches[2])  # the same augmentation after a resume
    records = [r for r in tf.data.TFRecordDataset(shaped[1], "GZIP").take(4).as_numpy_iterator()]
    parsed = parse_examples(tf.constant(records), kinds)

    model = build_model(module, ModelContext(inputs, stats, heads))
    export_dir = export_saved_model(model, inputs, heads, str(tmp_path / "export"), "label")
    raw = tf.saved_model.load(export_dir).signatures["predict_raw"]
    features = {k: v for k, v in parsed.items() if k != "label"}
    changed = {**features, "grid": features["grid"] + 100.0}  # preprocess overwrites the grid: no effect
    np.testing.assert_allclose(raw(**features)["scores"].numpy(), raw(**changed)["scores"].numpy(), atol=1e-6)
    assert model.get_layer("preprocess") is not None


def test_statistics_count_every_string_and_class_exactly():
    """Strings and class labels counted over batches: each distinct value with its row count,
    missing ("" or NaN) left out, integral float classes written without a decimal point."""
    batches = [{"w": np.array([[b"a"], [b"b"], [b""], [b"a"]], dtype=object), "y": np.array([[1.0], [2.0], [np.nan], [1.0]])},
               {"w": np.array([[b"b"], [b"a"]], dtype=object), "y": np.array([[2.0], [0.0]])}]
    stats = compute_stats(batches, {"w": "string", "y": "float32"}, classes=["y"])
    assert stats.strings["w"] == ["a", "b"] and stats.count == 6 and stats.missing == {"w": 1, "y": 1}
    assert stats.classes == {"y": {"1": 2, "2": 2, "0": 1}}
    with pytest.raises(ValueError, match="label 'y'.*holds 1.5, not a whole number"):
        compute_stats([{"y": np.array([[1.0], [1.5]])}], {"y": "float32"}, classes=["y"])
