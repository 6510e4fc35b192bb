"""The generic encoder's number columns: each standardized and followed by its missing indicator, in
name order, in a few ops per column (a model serving one row pays per op)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from trainer.features import TabularEncoder

NUMBERS = {"b": (3.3, 1.7), "a": (-1.25, 0.3), "c": (1e6, 12345.678), "d": (0.1, 0.7)}


def expected_numbers(features: dict[str, np.ndarray], numbers: dict) -> np.ndarray:
    """Column by column in NumPy, float32: (x - mean) / std, 0 where that is not finite (x missing,
    infinite, or too large to standardize), then that column's indicator (1 where it was not)."""
    parts = []
    for name, (mean, std) in sorted(numbers.items()):
        x = features[name].astype(np.float32).reshape(len(features[name]), -1)
        with np.errstate(invalid="ignore", over="ignore"):
            z = (x - np.float32(mean)) / np.float32(std)
        missing = ~np.isfinite(z)
        parts += [np.where(missing, np.float32(0), z), missing.astype(np.float32)]
    return np.concatenate(parts, axis=1)


def test_each_column_is_standardized_then_marked_in_name_order():
    rng = np.random.default_rng(0)
    n = 500
    features = {"a": rng.normal(-1, 1, (n, 1)).astype(np.float32), "b": rng.normal(3, 2, (n, 3)).astype(np.float32),
                "c": rng.normal(1e6, 1e4, (n, 2, 2)), "d": rng.integers(0, 5, (n, 1)),
                "s": rng.choice([b"x", b"y", b"z"], (n, 1))}
    features["b"][::7, 1] = np.nan
    features["a"][::11] = np.inf
    features["c"][::13, 0, 1] = -np.inf
    features["a"][5] = 3e38  # finite, but standardized it overflows: missing, not an infinite input to the model
    encoded = TabularEncoder(NUMBERS, {"s": ["x", "y"]})(features).numpy()

    want = expected_numbers(features, NUMBERS)
    assert encoded.shape == (n, want.shape[1] + 2)
    np.testing.assert_array_equal(encoded[:, :want.shape[1]].view(np.uint32), want.view(np.uint32))
    assert np.isfinite(encoded).all() and encoded[5, 1] == 1  # a's indicator, after its value
    np.testing.assert_array_equal(encoded[:, want.shape[1]:], np.eye(3, 2, dtype=np.float32)[
        [{b"x": 0, b"y": 1, b"z": 2}[v] for v in features["s"][:, 0]]])  # the one-hot after the numbers
    one = {"a": features["a"]}
    np.testing.assert_array_equal(TabularEncoder({"a": (1.0, 2.0)}, {})(one).numpy(),
                                  expected_numbers(one, {"a": (1.0, 2.0)}))


def _op_types(columns: int) -> list[str]:
    numbers = {f"n{i}": (float(i), 2.0) for i in range(columns)}
    encoder = TabularEncoder(numbers, {})
    specs = {name: tf.TensorSpec([None, 1], tf.float32) for name in numbers}
    graph = tf.function(encoder).get_concrete_function(specs).graph
    return [op.type for op in graph.get_operations()]


def test_numbers_take_four_ops_per_column_and_a_few_in_all():
    """A model serving one row pays per op: each number column is standardized, tested and zeroed
    in four ops (column by column with its indicator, seven), its indicator and the layout come
    from a few ops shared by all columns."""
    computing = {"Sub", "RealDiv", "IsFinite", "SelectV2", "Select", "ZerosLike", "LogicalNot", "Cast", "ConcatV2",
                 "GatherV2"}
    two, eight = ([t for t in _op_types(n) if t in computing] for n in (2, 8))
    assert len(eight) - len(two) == 4 * 6
    assert len(eight) == 4 * 8 + 5


def test_categorical_number_columns_are_one_hot_or_looked_up_as_text_columns_are():
    """trainer.categorical_features: codes counted as categories ("3"), one-hot under 31 values,
    an index for ColumnEmbeddings over 30; a missing (NaN) or unseen code matches none, and the
    same codes written as text encode to the same vector."""
    import keras
    import pytest

    from trainer.features import MAX_ONE_HOT, compute_stats

    rng = np.random.default_rng(1)
    n = 400
    few, many = rng.integers(1, 4, (n, 1)).astype(np.float32), rng.integers(0, 3 * MAX_ONE_HOT, (n, 1)).astype(np.float32)
    few[::9] = np.nan
    kinds = {"pclass": "int64", "zone": "int64", "fare": "float32"}
    batch = {"pclass": few, "zone": many, "fare": rng.normal(size=(n, 1)).astype(np.float32)}
    stats = compute_stats([batch], kinds, categorical=["pclass", "zone"])
    assert sorted(stats.strings["pclass"]) == ["1", "2", "3"] and stats.missing["pclass"] == len(few[::9])
    assert len(stats.lookups["zone"]) == len(np.unique(many)) > MAX_ONE_HOT
    assert set(stats.numbers) == {"fare"}

    encoder = TabularEncoder(stats.numbers, stats.strings, stats.lookups, stats.categorical)
    rows = {"pclass": np.array([[1.0], [3.0], [np.nan], [7.0]], np.float32),
            "zone": np.array([[float(stats.lookups["zone"][0])], [float(stats.lookups["zone"][5])], [np.nan], [-5.0]],
                             np.float32),
            "fare": np.zeros((4, 1), np.float32)}
    encoded = encoder(rows).numpy()
    one_hot, index = encoded[:, 2:5], encoded[:, 5]
    vocabulary = stats.strings["pclass"]
    assert one_hot[0].tolist() == [float(v == "1") for v in vocabulary]
    assert one_hot[1].tolist() == [float(v == "3") for v in vocabulary]
    assert one_hot[2].tolist() == one_hot[3].tolist() == [0.0, 0.0, 0.0]  # missing, unseen
    assert index.tolist() == [1.0, 6.0, 0.0, 0.0]
    as_text = TabularEncoder({}, {"pclass": vocabulary}, {"zone": stats.lookups["zone"]})(
        {"pclass": np.array([["1"], ["3"], [""], ["7"]]),
         "zone": np.array([[stats.lookups["zone"][0]], [stats.lookups["zone"][5]], [""], ["-5"]])}).numpy()
    np.testing.assert_array_equal(as_text, encoded[:, 2:])
    restored = keras.layers.deserialize(keras.layers.serialize(encoder))
    np.testing.assert_array_equal(restored(rows).numpy(), encoded)
    with pytest.raises(ValueError, match="feature 'fare' is categorical .* holds 0.5, not a whole number"):
        compute_stats([{"fare": np.array([[0.5]], np.float32)}], {"fare": "float32"}, categorical=["fare"])
