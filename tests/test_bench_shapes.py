"""The shapes bench's data and its bare script: the shape asked for, a label the numbers decide,
and the script's model the size of loopline's generic one, exported."""
from __future__ import annotations

import pandas as pd


def test_the_data_has_the_shape_asked_for(tmp_path):
    from bench.shapes import TEXT_VALUES, make_data

    make_data(tmp_path / "d.csv", rows=3000, numbers=6, texts=2, classes=40)
    frame = pd.read_csv(tmp_path / "d.csv")
    assert list(frame.columns) == [*(f"n{i}" for i in range(6)), "t0", "t1", "label"]
    assert len(frame) == 3000 and frame["label"].nunique() == 40 and frame["t1"].nunique() == TEXT_VALUES
    assert 0.005 < frame["n3"].isna().mean() < 0.02 and frame["label"].notna().all()
    # the label is the bin of n0 + n1: its mean rises with the class number
    means = (frame["n0"] + frame["n1"]).groupby(frame["label"].str[1:].astype(int)).mean()
    assert means.is_monotonic_increasing


def test_the_bare_script_trains_loopline_s_generic_model_and_exports_it(tmp_path):
    import tensorflow as tf

    import bench.shapes_script as script
    from bench.shapes import make_data
    from trainer import model

    assert (script.HIDDEN_UNITS, script.L2) == (model.HIDDEN_UNITS, model.L2)
    make_data(tmp_path / "d.csv", rows=600, numbers=3, texts=1, classes=5)
    script.main(str(tmp_path / "d.csv"), str(tmp_path / "export"), 64, 1)
    served = tf.saved_model.load(str(tmp_path / "export")).signatures["serving_default"]
    [scores] = served.structured_outputs.values()
    assert scores.shape[-1] == 5
