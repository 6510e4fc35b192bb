"""`loopline infer` on every data.format: the output holds the input's columns and the same
predictions as the server's `predict` signature on the same rows (as Parquet or CSV); a bad cell
is an error naming the column that leaves no partial file; an unknown version is refused."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from pipeline.config import load_config
from pipeline.infer import infer
from serving.servable import Servable
from serving.request_limits import RequestLimits
from tests.conftest import REPO
from tests.serving_helpers import add_version, example, export_model

ROWS = [(40.0, 190, "Dream"), (50.5, 220, "Biscoe"), (None, 205, "Torgersen")]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    base = tmp_path_factory.mktemp("infer")
    export = export_model(base / "export", kinds={"image": "image[8,8,1]"})  # tabular features and an image
    add_version(base / "root" / "serving" / "penguins", export, 3)
    return base / "root"


def config(root):
    return load_config(REPO / "loopline.yaml", [f"pipeline.root={root}", "mlflow.enabled=false"])


def served_scores(root, examples: list[bytes]) -> np.ndarray:
    servable = Servable("penguins", 3, str(root / "serving" / "penguins" / "3"), None, RequestLimits())
    try:
        return servable.run("predict", {"inputs": np.array(examples, dtype=object)})["species_scores"]
    finally:
        servable.unload()


def row_examples() -> list[bytes]:
    out = []
    for bill, flipper, island in ROWS:
        e = example(bill or 0.0, flipper, island)
        if bill is None:
            del e.features.feature["bill_length_mm"]
        out.append(e.SerializeToString())
    return out


def scores_of(frame: pd.DataFrame) -> np.ndarray:
    return frame[[f"predicted_species_score_{c}" for c in ("Adelie", "Chinstrap", "Gentoo")]].to_numpy(np.float32)


@pytest.mark.parametrize("data_format", ["csv", "parquet", "tfrecord"])
def test_every_tabular_format_gives_the_servers_predictions(tmp_path, root, data_format):
    frame = pd.DataFrame(ROWS, columns=["bill_length_mm", "flipper_length_mm", "island"])
    frame["note"] = ["a", "b", "c"]  # a column the model does not use: kept in the output
    if data_format == "csv":
        data = tmp_path / "rows.csv"
        frame.to_csv(data, index=False)
    elif data_format == "parquet":
        data = tmp_path / "rows.parquet"
        pq.write_table(pa.Table.from_pandas(frame.astype({"flipper_length_mm": "int64"}), preserve_index=False), data,
                       row_group_size=2)
    else:
        data = tmp_path / "rows.tfrecord.gz"
        with tf.io.TFRecordWriter(str(data), options="GZIP") as writer:
            for record in row_examples():
                writer.write(record)
    output = tmp_path / "out.parquet"
    result = infer(config(root), str(data), str(output), data_format=data_format, batch_size=2, progress=False)
    assert (result.version, result.examples) == (3, 3)
    out = pd.read_parquet(output)
    np.testing.assert_allclose(scores_of(out), served_scores(root, row_examples()), rtol=1e-6, atol=1e-7)
    assert list(out["island"].astype(str)) == ["Dream", "Biscoe", "Torgersen"]
    assert {"predicted_species", "predicted_body_mass_g"} <= set(out.columns)
    assert list(out["predicted_species"]) == [["Adelie", "Chinstrap", "Gentoo"][i] for i in scores_of(out).argmax(1)]
    if data_format != "tfrecord":
        assert list(out["note"]) == ["a", "b", "c"]


def test_an_image_folder_and_a_csv_output(tmp_path, root):
    images = {}
    for label, value in (("bright", 250), ("dark", 10)):
        (tmp_path / "images" / label).mkdir(parents=True)
        png = tf.io.encode_png(tf.fill([8, 8, 1], tf.constant(value, tf.uint8))).numpy()
        (tmp_path / "images" / label / "0.png").write_bytes(png)
        e = tf.train.Example()
        e.features.feature["image"].bytes_list.value.append(png)
        images[label] = e.SerializeToString()
    output = tmp_path / "out.csv"
    infer(config(root), str(tmp_path / "images"), str(output), data_format="image_folder", progress=False)
    out = pd.read_csv(output)
    assert list(out["label"]) == ["bright", "dark"] and out["path"].str.endswith("0.png").all()
    np.testing.assert_allclose(scores_of(out), served_scores(root, [images["bright"], images["dark"]]), rtol=1e-5)


def test_a_bad_cell_names_the_column_and_leaves_no_file(tmp_path, root):
    data = tmp_path / "rows.csv"
    data.write_text("bill_length_mm,flipper_length_mm,island\n40.0,190,Dream\n41.0,heavy,Dream\n")
    with pytest.raises(ValueError, match="flipper_length_mm: int64"):
        infer(config(root), str(data), str(tmp_path / "out" / "p.parquet"), data_format="csv", progress=False)
    assert list((tmp_path / "out").iterdir()) == []
    with pytest.raises(FileNotFoundError, match="no version 99 of model penguins"):
        infer(config(root), str(data), str(tmp_path / "p.parquet"), version=99, data_format="csv", progress=False)
    with pytest.raises(ValueError, match="give a .parquet or .csv file"):
        infer(config(root), str(data), str(tmp_path / "p.json"), data_format="csv", progress=False)
