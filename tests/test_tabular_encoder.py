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
