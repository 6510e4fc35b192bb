"""A Keras model's floating-point operations per example, counted from its layers (what
`trainer.jit_compile: auto` weighs on CPU, and what the train bench sets against the machine).

Only `Dense` layers are counted: 2 * in * out per example (a multiply and an add per weight), times
the positions it is applied at when its input has more than one axis after the batch (a Dense on
`[batch, steps, in]` runs once per step). Biases, activations, normalisation, the encoder's
one-hot and scaling, losses and the optimizer's update are left out: for an MLP they are a few
per cent of the matmuls at most. Layers that hold weights but are not Dense (Conv, Embedding,
EinsumDense, attention...) are not counted either, nor layers not built yet (a subclassed model
before its first call); they are named in `uncounted`, so a figure built on the count says what
it misses. Training is counted as 3x forward: for each Dense, the
forward matmul, the gradient of its kernel (x^T dy) and of its input (dy W^T), each as costly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

import keras

TRAINING_FACTOR = 3


@dataclass
class FlopCount:
    forward: int  # per example
    dense_shapes: list[tuple[int, int, int]] = field(default_factory=list)  # (positions, in, out) per Dense
    uncounted: list[str] = field(default_factory=list)  # "name (Class)" of layers with weights, not Dense

    @property
    def training(self) -> int:
        return TRAINING_FACTOR * self.forward


def _layers(model):
    """Every leaf layer, nested models (a Functional model used as a layer) opened."""
    for layer in model.layers:
        if hasattr(layer, "layers") and layer.layers:
            yield from _layers(layer)
        else:
            yield layer


def _positions(layer) -> int:
    """How many times per example a Dense runs: the input's axes between batch and features (1 for
    a layer with no single known input, e.g. one shared between calls)."""
    try:
        shape = layer.input.shape
    except (AttributeError, ValueError):
        return 1
    return int(prod(d or 1 for d in shape[1:-1])) if len(shape) > 2 else 1


def count_flops(model: keras.Model) -> FlopCount:
    count = FlopCount(0)
    for layer in _layers(model):
        if isinstance(layer, keras.layers.Dense) and layer.built:
            fan_in, fan_out = layer.kernel.shape
            positions = _positions(layer)
            count.dense_shapes.append((positions, int(fan_in), int(fan_out)))
            count.forward += 2 * positions * int(fan_in) * int(fan_out)
        elif not layer.built or layer.weights:  # a layer not built yet has no shapes to count
            count.uncounted.append(f"{layer.name} ({type(layer).__name__})")
    return count
