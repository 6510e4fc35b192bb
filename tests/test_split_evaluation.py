"""The Trainer's final evaluation on the eval split reuses the periodic evaluation's traced step
(SplitEvaluation.on) when the two splits' elements have the same spec: the same figures as an
evaluation of its own, one trace fewer. Tiny in-memory data, no files."""
from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer.heads import REGRESSION, Head
from trainer.split_eval import SplitEvaluation


def _split(rows: int, seed: int, width: int = 1) -> tf.data.Dataset:
    rng = np.random.default_rng(seed)
    features = {"x": rng.normal(size=(rows, width)).astype(np.float32)}
    targets = {"y": rng.normal(size=(rows, 1)).astype(np.float32)}
    return tf.data.Dataset.from_tensor_slices((features, targets)).batch(16)


@pytest.fixture(scope="module")
def model_and_heads():
    inputs = {"x": keras.Input((None,), name="x")}
    model = keras.Model(inputs, {"y": keras.layers.Dense(1)(keras.layers.Lambda(lambda t: t[:, :1], output_shape=(1,))(inputs["x"]))})
    mae = keras.metrics.MeanAbsoluteError()
    return model, [Head("y", REGRESSION, label_dtype="float32")], {"y_mae": (mae, lambda t, o: (t["y"], o["y"]))}


def test_an_evaluation_on_a_split_of_the_same_spec_shares_the_trace_and_the_figures(model_and_heads):
    model, heads, metrics = model_and_heads
    validation, eval_split = _split(40, 0), _split(70, 1)
    periodic = SplitEvaluation(model, heads, validation, metrics)
    periodic_figures = periodic()
    final = periodic.on(eval_split)
    assert final.step is periodic.step and final.dataset is eval_split and periodic.dataset is validation
    alone = SplitEvaluation(model, heads, eval_split, {"y_mae": (keras.metrics.MeanAbsoluteError(), metrics["y_mae"][1])})
    assert final() == pytest.approx(alone(), rel=1e-6) and final()["y_examples"] == 70
    assert periodic() == periodic_figures  # the metric objects are reset at each call


def test_a_split_of_another_spec_gets_its_own_trace(model_and_heads):
    model, heads, metrics = model_and_heads
    periodic = SplitEvaluation(model, heads, _split(40, 0), metrics)
    wider = _split(30, 2, width=3)  # another element spec: [None, 3] features
    final = periodic.on(wider)
    assert final.step is not periodic.step
    assert final()["y_examples"] == 30
