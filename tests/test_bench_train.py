"""The train bench's parts against the machine: the FLOP count read from a model's layers and the
matmul rate it is set against (no timing is asserted)."""
from __future__ import annotations

import keras
import pytest

from trainer.flops import count_flops


def test_flops_count_every_dense_layer_nested_and_per_position_and_name_the_rest():
    inputs = keras.Input((16,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    inner = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)], name="inner")  # a model used as a layer
    out = inner(hidden)
    tokens = keras.Input((5,), dtype="int32")
    embedded = keras.layers.Embedding(10, 3, name="embed")(tokens)  # weights, but not a Dense: not counted
    per_token = keras.layers.Dense(2, name="per_token")(embedded)  # a Dense on [batch, 5, 3]: 5 positions
    model = keras.Model([inputs, tokens], [out, per_token])
    count = count_flops(model)
    assert count.forward == 2 * (16 * 8 + 8 * 4 + 5 * 3 * 2)
    assert count.training == 3 * count.forward
    assert sorted(count.dense_shapes) == [(1, 8, 4), (1, 16, 8), (5, 3, 2)]
    assert count.uncounted == ["embed (Embedding)"]


@pytest.mark.parametrize("jit", [False, True])
def test_matmul_rate_runs_the_step_matmuls_of_the_shapes(jit):
    from bench.train import matmul_rate

    wall, cpu = matmul_rate([(1, 8, 4), (2, 4, 2)], batch=4, jit=jit, seconds=0.01)
    assert wall > 0 and cpu > 0
