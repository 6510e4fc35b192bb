"""Model modules for trainer tests, written to a file per test (the trainer loads modules by path).

PROBE: a small tabular model with a `probe` weight whose only loss is `probe` itself, added
through `model.losses`: its gradient is 1 at every step, so Adam moves it by exactly the
learning rate it applies (m/sqrt(v) = 1). Reading it after each step shows the rate the
optimizer used. BUILT keeps each built model with its initial weights (the trained model is the
first one a run builds; the second is the export copy).
"""
from __future__ import annotations

PROBE = '''
import keras
import tensorflow as tf

BUILT = []


class Probe(keras.layers.Layer):
    def build(self, shape):
        self.probe = self.add_weight(shape=(), initializer="zeros", name="probe")

    def call(self, x):
        self.add_loss(self.probe * 1.0)
        return x


def build_model(ctx):
    inputs = ctx.inputs()
    x = Probe(name="probe")(ctx.encoder()(inputs))
    for i in range(2):
        x = keras.layers.Dense(16, activation="relu", name=f"hidden_{i}")(x)
    model = keras.Model(inputs, {h.name: h.output_layer(x) for h in ctx.heads})
    BUILT.append((model, [w.copy() for w in model.get_weights()]))
    return model
'''


def write_module(folder, text: str = "", name: str = "module.py") -> str:
    """PROBE plus `text` (e.g. a loss_weights hook) as a module file; returns its path."""
    path = folder / name
    path.write_text(PROBE + text)
    return str(path)


def built(path: str):
    """The loaded module's BUILT list (the same module object the trainer loaded)."""
    from trainer.model import load_module

    return load_module(path).BUILT


class Recorder:
    """A metric sink that keeps every train figure per step, and the trained model's probe
    weight after each call (steps_per_loop=1: after each step)."""

    def __init__(self, module_path: str | None = None):
        self.module_path = module_path
        self.train: dict[int, dict[str, float]] = {}
        self.probe: dict[int, float] = {}

    def log(self, step, metrics):
        train = {k[len("train/"):]: v for k, v in metrics.items() if k.startswith("train/")}
        if "loss" in train:
            self.train[step] = train
            if self.module_path:
                model = built(self.module_path)[-2][0]  # this run's trained model (the export copy is last)
                self.probe[step] = float(model.get_layer("probe").probe.numpy())

    def close(self):
        pass

    def series(self, key: str) -> list[float]:
        return [self.train[s][key] for s in sorted(self.train)]

    def probe_steps(self) -> list[float]:
        """The probe's change at each step (its start is 0)."""
        values = [0.0] + [self.probe[s] for s in sorted(self.probe)]
        return [b - a for a, b in zip(values, values[1:])]
