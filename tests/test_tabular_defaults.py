"""The generic tabular model's defaults: a text column of many values through a vocabulary lookup and
an embedding (converting to TFLite builtins), L2 on the hidden layers, early stopping on."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.trainer_data import write_examples
from trainer.config import TrainerConfig
from trainer.export import export_model
from trainer.export_config import ExportConfig
from trainer.features import MAX_ONE_HOT, ColumnEmbeddings, TabularEncoder
from trainer.loop import train
from trainer.selection import AUTO_PATIENCE, resolve_patience


def named_splits(folder, rows: int = 600, families: int = 120, seed: int = 4) -> tuple[str, str]:
    """survived yes/no from x plus a per-family effect: the family name (120 values) carries signal."""
    rng = np.random.default_rng(seed)
    effect = rng.normal(0.0, 2.0, families)
    paths = []
    for split, n in (("train", rows), ("eval", rows // 2)):
        family = rng.integers(0, families, n)
        x = rng.normal(size=n).astype(np.float32)
        score = x + effect[family] + 0.3 * rng.normal(size=n)
        names = np.array([f"Family{i:03d}" for i in family], dtype=object)
        if split == "eval":
            names[:10] = "Newcomer"  # a value the train split never held
        (folder / split).mkdir(parents=True, exist_ok=True)
        paths.append(write_examples(folder / split / "data.gz", {"x": x, "family": names,
                                                                  "survived": np.where(score > 0, "yes", "no")}))
    return paths[0], paths[1]


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    folder = tmp_path_factory.mktemp("named")
    splits = named_splits(folder / "data")
    return splits, train(TrainerConfig(epochs=8, seed=2), *splits, "survived"), folder


def test_a_text_column_of_many_values_is_looked_up_and_embedded(named):
    _, result, _ = named
    assert len(result.stats.lookups["family"]) > MAX_ONE_HOT and "family" not in result.stats.strings
    encoder, embeddings = result.model.get_layer("encoder"), result.model.get_layer("embeddings")
    assert isinstance(encoder, TabularEncoder) and isinstance(embeddings, ColumnEmbeddings)
    # The family effect is learned: better than x alone can do (its accuracy is about 0.6 here).
    assert result.metrics["survived_accuracy"] > 0.8
    # Unseen and missing names read as index 0, the zero vector (nothing learned for them).
    rows = {"x": tf.zeros([3, 1]), "family": tf.constant([["Newcomer"], [""], ["Family001"]])}
    indices = encoder(rows)[:, -1].numpy()
    assert indices[0] == indices[1] == 0 and indices[2] > 0
    vectors = embeddings(encoder(rows))[:, -embeddings.tables[0].output_dim:].numpy()
    assert not vectors[:2].any() and vectors[2].any()


def test_indices_keep_their_value_under_mixed_precision():
    """A bfloat16 index would round 1001 to 1000: the embeddings layer reads its input in float32."""
    import keras

    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        layer = ColumnEmbeddings([2000])
        x = tf.constant([[0.5, 1001.0], [0.5, 1000.0]])
        out = layer(x)
    finally:
        keras.config.set_dtype_policy("float32")
    table = layer.tables[0].embeddings.numpy()
    width = table.shape[1]
    np.testing.assert_allclose(np.asarray(out[:, 1:], np.float32), table[[1001, 1000]].astype("bfloat16").astype(np.float32))
    assert out.shape == (2, 1 + width)


def test_the_lookup_converts_to_tflite_builtins_with_parity(named, tmp_path):
    """The export's parity gate runs each TFLite variant in the interpreter (builtin ops only: the
    converter is not given Select TF ops) against the SavedModel on eval examples."""
    (train_path, eval_path), result, _ = named
    config = ExportConfig(tflite_variants=["float32", "dynamic_range", "float16"], latency_runs=2)
    report = export_model(result.model, result.kinds, result.heads, result.metrics, str(tmp_path / "serving"),
                          str(tmp_path), train_path, eval_path, config, exported=result.exported)
    assert [(v["variant"], v["passed"]) for v in report["tflite"]] == [("float32", True), ("dynamic_range", True),
                                                                      ("float16", True)], report["tflite"]
    assert report["exported"] == result.exported


def test_the_generic_model_is_regularized_and_stops_early(named):
    _, result, _ = named
    hidden = [layer for layer in result.model.layers if layer.name.startswith("hidden_")]
    assert hidden and all(layer.kernel_regularizer is not None for layer in hidden)
    assert resolve_patience("auto", "auto", generic_model=True) == AUTO_PATIENCE
    assert resolve_patience("auto", "auto", generic_model=False) is None  # a module on the auto metric
    assert resolve_patience("auto", "species_accuracy", generic_model=False) == AUTO_PATIENCE
    assert resolve_patience(None, "auto", generic_model=True) is None and resolve_patience(4, None, False) == 4
