"""data.format: each reader through a partial run of the real pipeline (ExampleGen only), on
small files written here; the artifact is the CSV ExampleGen's (Split-train/Split-eval GZIP
TFRecords of tf.Examples), with data.eval_path giving the eval split."""
from __future__ import annotations

import glob
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from tests.conftest import make_config
from tests.test_beam_args import run_example_gen
from tests.test_data_shapes import example, png


def split_examples(config, split: str) -> list[tf.train.Example]:
    pattern = os.path.join(config.pipeline.root, "tfx", "CsvExampleGen", "examples", "*", f"Split-{split}", "*.gz")
    files = glob.glob(pattern)
    assert files, f"no TFRecords at {pattern}"
    return [tf.train.Example.FromString(r) for r in tf.data.TFRecordDataset(files, "GZIP").as_numpy_iterator()]


def rows_of(config) -> list[tf.train.Example]:
    return split_examples(config, "train") + split_examples(config, "eval")


@pytest.mark.parametrize("compressed", [True, False])
def test_tfrecord_through_import_example_gen(tmp_path, compressed):
    name = "data.tfrecord.gz" if compressed else "data.tfrecord"
    with tf.io.TFRecordWriter(str(tmp_path / name), options="GZIP" if compressed else None) as writer:
        for i in range(30):
            writer.write(example(pixels=np.full(4, i, np.float32), tags=["a", "b"][: 1 + i % 2], y=[i % 3]))
    config = make_config(tmp_path / "root", "data.format=tfrecord", f"data.path={tmp_path / name}")
    run_example_gen(config)
    rows = rows_of(config)
    assert len(rows) == 30 and len(split_examples(config, "eval")) > 0
    assert sorted(r.features.feature["pixels"].float_list.value[0] for r in rows) == list(range(30))
    assert {len(r.features.feature["tags"].bytes_list.value) for r in rows} == {1, 2}  # lists kept


def test_parquet_scalars_lists_and_nulls(tmp_path):
    table = pa.table({
        "sepal length (cm)": [float(i) for i in range(24)],
        "count": [i if i % 5 else None for i in range(24)],
        "embedding": [[float(i), 1.0, 2.0] for i in range(24)],
        "tags": [["x", "y"][: 1 + i % 2] for i in range(24)],
        "species": [f"s{i % 3}" for i in range(24)],
    })
    pq.write_table(table, tmp_path / "train.parquet", row_group_size=10)
    pq.write_table(table.slice(0, 6), tmp_path / "eval.parquet")
    config = make_config(tmp_path / "root", "data.format=parquet", f"data.path={tmp_path / 'train.parquet'}",
                         f"data.eval_path={tmp_path / 'eval.parquet'}")
    run_example_gen(config)
    train, evaluation = split_examples(config, "train"), split_examples(config, "eval")
    assert len(train) == 24 and len(evaluation) == 6
    first = min(train, key=lambda r: r.features.feature["sepal length (cm)"].float_list.value[0]).features.feature
    assert list(first["embedding"].float_list.value) == [0.0, 1.0, 2.0]
    assert list(first["tags"].bytes_list.value) == [b"x"] and first["species"].bytes_list.value == [b"s0"]
    assert not first["count"].int64_list.value  # a null cell: a value-less feature


def write_image_folder(folder, classes=("cat", "dog"), per_class=6, size=(5, 5)):
    for index, name in enumerate(classes):
        os.makedirs(folder / name, exist_ok=True)
        for i in range(per_class):
            (folder / name / f"{i}.png").write_bytes(png(np.full(size, 40 * index + i)))


def test_image_folder_with_an_eval_folder(tmp_path):
    write_image_folder(tmp_path / "train")
    write_image_folder(tmp_path / "eval", per_class=2)
    config = make_config(tmp_path / "root", "data.format=image_folder", f"data.path={tmp_path / 'train'}",
                         f"data.eval_path={tmp_path / 'eval'}", "data.label=label")
    run_example_gen(config)
    train = split_examples(config, "train")
    assert len(train) == 12 and len(split_examples(config, "eval")) == 4
    labels = sorted(r.features.feature["label"].bytes_list.value[0] for r in train)
    assert labels == [b"cat"] * 6 + [b"dog"] * 6
    decoded = tf.io.decode_png(train[0].features.feature["image"].bytes_list.value[0])
    assert decoded.shape == (5, 5, 1)


def test_image_folder_refuses_a_file_that_is_no_image(tmp_path):
    write_image_folder(tmp_path / "images", per_class=2)
    (tmp_path / "images" / "cat" / "notes.txt").write_text("not an image")
    config = make_config(tmp_path / "root", "data.format=image_folder", f"data.path={tmp_path / 'images'}")
    with pytest.raises(Exception, match=r"notes.txt: not a PNG, JPEG, GIF or BMP image"):
        run_example_gen(config)


@pytest.mark.slow
def test_tfrecord_pipeline_fixed_shapes_lists_and_integer_classes(tmp_path):
    """The whole pipeline on GZIP TFRecords: an 8x8 float grid, a list of words and a PNG per
    example, integer class labels declared classification; the schema records the grid's shape and
    the PNG's image domain; the export decodes the PNG inside serving_default as the input path did."""
    from pipeline.local_runner import run_local
    from validation.schema import load_schema

    rng = np.random.default_rng(0)
    with tf.io.TFRecordWriter(str(tmp_path / "part-0.tfrecord.gz"), options="GZIP") as writer:
        for i in range(240):
            label = i % 3
            grid = rng.normal(size=(8, 8)).astype(np.float32)
            grid[label * 2:label * 2 + 2] += 3.0
            photo = png(np.full((4, 4), 60 * label + i % 7))
            writer.write(example(grid=grid, words=[f"w{label}", "any", "x"][: 1 + i % 3], photo=[photo], digit=[label]))
    config = make_config(tmp_path / "root", "data.format=tfrecord", f"data.path={tmp_path / '*.tfrecord.gz'}",
                         "data.label=digit", "data.label_kind=classification", "trainer.epochs=8",
                         "mlflow.enabled=false", "serving.model_name=grids")
    summary = run_local(config)
    assert summary.metrics["digit_accuracy"] > 0.9
    schema = load_schema(glob.glob(os.path.join(config.pipeline.root, "tfx", "SchemaGen", "schema", "*"))[0])
    features = {f.name: f for f in schema.feature}
    assert [d.size for d in features["grid"].shape.dim] == [64]
    assert features["words"].value_count.max == 3
    assert features["photo"].HasField("image_domain")
    model = tf.saved_model.load(summary.saved_model)
    raw = model.signatures["predict_raw"]
    assert {k: v.shape.as_list() for k, v in raw.structured_input_signature[1].items()} == {
        "grid": [None, 64], "words": [None, 3], "photo": [None, 4, 4, 1]}
    # serving_default takes the tf.Examples (PNG bytes inside); predict_raw the decoded image: same answer.
    records = [r.SerializeToString() for r in split_examples(config, "eval")[:5]]
    by_example = model.signatures["serving_default"](inputs=tf.constant(records))["scores"].numpy()
    decoded = {
        "grid": tf.constant([list(r.features.feature["grid"].float_list.value) for r in map(tf.train.Example.FromString, records)]),
        "words": tf.constant([(list(r.features.feature["words"].bytes_list.value) + [b""] * 3)[:3]
                              for r in map(tf.train.Example.FromString, records)]),
        "photo": tf.stack([tf.cast(tf.io.decode_png(tf.train.Example.FromString(r).features.feature["photo"].bytes_list.value[0]),
                                   tf.float32) / 255.0 for r in records]),
    }
    np.testing.assert_allclose(raw(**decoded)["scores"].numpy(), by_example, atol=1e-5)


@pytest.mark.slow
def test_parquet_pipeline_list_columns_and_a_regression_label(tmp_path):
    """The whole pipeline on Parquet: a fixed-length list, a variable list of strings and PNG bytes
    in a binary column, a regression label whose name has a space and a non-ASCII sign."""
    from pipeline.local_runner import run_local

    rng = np.random.default_rng(1)
    embedding = rng.normal(size=(300, 4))
    table = pa.table({
        "embedding": [list(map(float, row)) for row in embedding],
        "tags": [["a", "b", "c"][: 1 + i % 3] for i in range(300)],
        "thumb": [png(np.full((3, 3), 20 * (i % 5))) for i in range(300)],  # PNG bytes in a binary column
        "price (€)": [float(10 + 5 * row[0] - 3 * row[2] + rng.normal(0, 0.1)) for row in embedding],
    })
    pq.write_table(table, tmp_path / "houses.parquet", row_group_size=100)
    config = make_config(tmp_path / "root", "data.format=parquet", f"data.path={tmp_path / 'houses.parquet'}",
                         "data.label=price (€)", "trainer.epochs=10", "mlflow.enabled=false",
                         "serving.model_name=houses", "evaluator.thresholds={}")
    summary = run_local(config)
    assert summary.metrics["price_rmse"] < 2.5  # the label's std is ~5.8
    raw = tf.saved_model.load(summary.saved_model).signatures["predict_raw"]
    assert sorted(raw.structured_input_signature[1]) == ["embedding", "tags", "thumb"]
    assert raw.structured_input_signature[1]["thumb"].shape.as_list() == [None, 3, 3, 1]  # decoded in the graph
    from validation.schema import load_schema

    schema = load_schema(glob.glob(os.path.join(config.pipeline.root, "tfx", "SchemaGen", "schema", "*"))[0])
    assert next(f for f in schema.feature if f.name == "thumb").HasField("image_domain")
