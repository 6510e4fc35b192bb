"""This trainer vs Keras `model.fit` on the same MLP (16-128-128-2), data and input pipeline.

All figures come from one process, side by side: the input pipeline alone (TFRecords ->
parsed batches), fit with default settings, fit at its best (steps_per_execution + XLA), and the
loop at its best (steps_per_loop inside one tf.function + XLA). Steady-state rates: the first
epoch (or loop call), which compiles, is left out.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time

import numpy as np

ROWS, FEATURES, BATCH, EPOCHS, STEPS_PER_LOOP = 200_000, 16, 256, 2, 32

MODULE = '''
import keras
def build_model(ctx):
    inputs = ctx.inputs()
    x = ctx.encoder()(inputs)
    for i in range(2):
        x = keras.layers.Dense(128, activation="relu", name=f"hidden_{i}")(x)
    return keras.Model(inputs, {h.name: h.output_layer(x) for h in ctx.heads})
'''


def _write_data(folder: str) -> tuple[str, str]:
    import tensorflow as tf

    rng = np.random.default_rng(0)
    paths = []
    for split, rows in (("train", ROWS), ("eval", 2048)):
        x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
        y = np.where(x[:, :4].sum(axis=1) > 0, "pos", "neg")
        path = os.path.join(folder, f"{split}.gz")
        with tf.io.TFRecordWriter(path, options="GZIP") as writer:
            for i in range(rows):
                feature = {f"f{j:02d}": tf.train.Feature(float_list=tf.train.FloatList(value=[x[i, j]])) for j in range(FEATURES)}
                feature["label"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[y[i].encode()]))
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        paths.append(path)
    return paths[0], paths[1]


class _Rates:
    """The loop's examples/s per steps_per_loop chunk, after the first epoch: fit's figure is its
    last epoch's (the input cache is warm then), so both are measured on the same footing."""

    def __init__(self, warm_after_step: int = 0):
        self.warm_after_step = warm_after_step
        self.values = []

    def log(self, step, metrics):
        if "train/examples_per_sec" in metrics and step > self.warm_after_step:
            self.values.append(metrics["train/examples_per_sec"])

    def close(self):
        pass


def run() -> dict:
    import keras
    import tensorflow as tf

    from trainer.config import TrainerConfig
    from trainer.features import compute_stats, infer_feature_kinds
    from trainer.inputs import parsed_batches, training_stream
    from trainer.loop import train
    from trainer.model import ModelContext, build_model, load_module, make_head

    folder = tempfile.mkdtemp(prefix="loopline-bench-")
    train_path, eval_path = _write_data(folder)
    module_path = os.path.join(folder, "mlp.py")
    with open(module_path, "w") as f:
        f.write(MODULE)
    steps_per_epoch = ROWS // BATCH
    config = TrainerConfig(module_file=module_path, epochs=EPOCHS, batch_size=BATCH, learning_rate=1e-3,
                           jit_compile=True, steps_per_loop=STEPS_PER_LOOP, tensorboard=False)

    # The input pipeline alone, as the loop sees it (cached after the first pass).
    kinds = infer_feature_kinds(train_path)
    stats = compute_stats(parsed_batches(train_path, kinds), kinds)
    heads = [make_head("label", kinds["label"], stats)]
    stream = training_stream(train_path, kinds, heads, BATCH, config.input, seed=0)
    iterator = iter(stream)
    for _ in range(steps_per_epoch):  # fills the cache
        next(iterator)
    started = time.perf_counter()
    for _ in range(steps_per_epoch):
        next(iterator)
    input_rate = steps_per_epoch * BATCH / (time.perf_counter() - started)

    # fit on the same stream and model, default settings and at its best.
    ctx = ModelContext({k: v for k, v in kinds.items() if k != "label"}, stats, heads)

    def fit_rate(**compile_args) -> float:
        keras.utils.set_random_seed(0)
        model = build_model(load_module(module_path), ctx)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss={"label": "sparse_categorical_crossentropy"}, **compile_args)
        times = []

        class Timer(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self.started = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                times.append(time.perf_counter() - self.started)

        data = training_stream(train_path, kinds, heads, BATCH, config.input, seed=0)
        model.fit(data, epochs=EPOCHS, steps_per_epoch=steps_per_epoch, callbacks=[Timer()], verbose=0)
        return steps_per_epoch * BATCH / statistics.median(times[1:])

    # The loop first: after fit(jit_compile=True) in the same process its trace failed here.
    rates = _Rates(warm_after_step=steps_per_epoch + config.steps_per_loop)
    train(config, train_path, eval_path, "label", metric_sinks=[rates])
    loop = statistics.median(rates.values)
    plain_rates = _Rates(warm_after_step=steps_per_epoch + 1)
    train(config.model_copy(update={"jit_compile": False, "steps_per_loop": 1}),
          train_path, eval_path, "label", metric_sinks=[plain_rates])
    plain = statistics.median(plain_rates.values)

    fit_default = fit_rate()
    fit_best = fit_rate(steps_per_execution=STEPS_PER_LOOP, jit_compile=True)

    result = {
        "rows": ROWS, "batch_size": BATCH, "epochs": EPOCHS, "model": "16-128-128-2 MLP",
        "input_pipeline_examples_per_sec": round(input_rate),
        "loop_examples_per_sec": round(loop),
        "loop_plain_examples_per_sec": round(plain),
        "fit_default_examples_per_sec": round(fit_default),
        "fit_best_examples_per_sec": round(fit_best),
        "ratio_vs_fit_default": round(loop / fit_default, 3),
        "ratio_vs_fit_best": round(loop / fit_best, 3),
        "loop_settings": {"jit_compile": True, "steps_per_loop": STEPS_PER_LOOP},
        "fit_best_settings": {"jit_compile": True, "steps_per_execution": STEPS_PER_LOOP},
    }
    result["ratio"] = result["ratio_vs_fit_best"]
    print(" ".join(f"{k}={v}" for k, v in result.items() if not isinstance(v, dict)))
    return result
