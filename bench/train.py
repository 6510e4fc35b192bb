"""This trainer vs Keras `model.fit` on the same MLP (16-128-128-2), data and input pipeline.

All figures come from one process, side by side: the input pipeline alone (TFRecords ->
parsed batches), fit with default settings, fit at its best (steps_per_execution + XLA), the loop
with loopline's default settings (jit_compile and steps_per_loop "auto"), and the loop at its
best (steps_per_loop inside one tf.function, unroll_steps per XLA call). Steady-state
rates over the last epoch: the first, which compiles and fills caches, is left out.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time

import numpy as np

ROWS, FEATURES, BATCH, EPOCHS, STEPS_PER_LOOP, UNROLL, REPEATS = 200_000, 16, 256, 2, 32, 8, 3

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
    """The loop's examples/s over its last epoch, wall clock from the end of its first chunk to the
    end of its last (everything between chunks included, the final evaluation not): fit's figure
    is its last epoch's, timed by a callback, so both stand on the same footing."""

    def __init__(self, warm_after_step: int):
        self.warm_after_step = warm_after_step
        self.marks = []

    def log(self, step, metrics):
        if "train/loss" in metrics and step > self.warm_after_step:
            self.marks.append((time.perf_counter(), step))

    def rate(self, batch_size: int) -> float:
        (start, first), (end, last) = self.marks[0], self.marks[-1]
        return (last - first) * batch_size / (end - start)

    def close(self):
        pass


def run() -> dict:
    import keras
    import tensorflow as tf

    from trainer.config import TrainerConfig
    from trainer.features import compute_stats, infer_feature_kinds
    from trainer.inputs import column_batches, load_in_memory, training_stream
    from trainer.loop import train
    from trainer.model import ModelContext, build_model, load_module, make_head

    folder = tempfile.mkdtemp(prefix="loopline-bench-")
    train_path, eval_path = _write_data(folder)
    module_path = os.path.join(folder, "mlp.py")
    with open(module_path, "w") as f:
        f.write(MODULE)
    steps_per_epoch = ROWS // BATCH
    config = TrainerConfig(module_file=module_path, epochs=EPOCHS, batch_size=BATCH, learning_rate=1e-3,
                           jit_compile=True, steps_per_loop=STEPS_PER_LOOP, unroll_steps=UNROLL, tensorboard=False)

    kinds = infer_feature_kinds(train_path)
    in_memory = load_in_memory(train_path, kinds, config.input, BATCH)  # parsed once, as the loop does
    stats = compute_stats(column_batches(in_memory), kinds)
    heads = [make_head("label", kinds["label"], stats)]

    # The input pipeline alone, drained inside a tf.function as the loop does: the split parsed
    # once and held in memory (the default when it fits; both sides below train on it), and the
    # records streamed and parsed every epoch.
    @tf.function
    def drain(iterator, batches):
        for _ in tf.range(batches):
            next(iterator)
        return 0

    def input_rate(columns) -> float:
        iterator = iter(training_stream(train_path, kinds, heads, BATCH, config.input, seed=0, columns=columns))
        drain(iterator, tf.constant(steps_per_epoch))  # fills the record cache
        started = time.perf_counter()
        drain(iterator, tf.constant(steps_per_epoch))
        return steps_per_epoch * BATCH / (time.perf_counter() - started)

    # fit on the same stream and model, default settings and at its best.
    ctx = ModelContext({k: v for k, v in kinds.items() if k != "label"}, stats, heads)

    def fit_rate(**compile_args) -> float:
        keras.utils.set_random_seed(0)
        model = build_model(load_module(module_path), ctx)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss={"label": "sparse_categorical_crossentropy"}, **compile_args)
        rates = []

        class Timer(keras.callbacks.Callback):
            """Examples per second of an epoch, from the optimizer steps Keras ran (with
            steps_per_execution it may run more than steps_per_epoch)."""

            def on_epoch_begin(self, epoch, logs=None):
                self.started, self.first = time.perf_counter(), int(self.model.optimizer.iterations)

            def on_epoch_end(self, epoch, logs=None):
                ran = int(self.model.optimizer.iterations) - self.first
                rates.append(ran * BATCH / (time.perf_counter() - self.started))

        data = training_stream(train_path, kinds, heads, BATCH, config.input, seed=0, columns=in_memory)
        model.fit(data, epochs=EPOCHS, steps_per_epoch=steps_per_epoch, callbacks=[Timer()], verbose=0)
        return statistics.median(rates[1:])

    # Alternating repeats, medians: drift on a shared machine hits both sides alike.
    def loop_rate(trainer_config) -> float:
        rates = _Rates(warm_after_step=steps_per_epoch)
        train(trainer_config, train_path, eval_path, "label", metric_sinks=[rates])
        return rates.rate(BATCH)

    # loopline's defaults: only what the bench must set (its model, data size, rate; no summaries).
    defaults = TrainerConfig(module_file=module_path, epochs=EPOCHS, batch_size=BATCH, learning_rate=1e-3,
                             tensorboard=False)
    # The same defaults on a split too big for trainer.input.in_memory_mb: records streamed and parsed every epoch.
    streamed = defaults.model_copy(update={"input": defaults.input.model_copy(update={"in_memory_mb": 0})})
    loops, fits_best, loop_defaults, fits_default, loop_streamed = [], [], [], [], []
    for _ in range(REPEATS):
        fits_best.append(fit_rate(steps_per_execution=STEPS_PER_LOOP, jit_compile=True))
        loops.append(loop_rate(config))
        fits_default.append(fit_rate())
        loop_defaults.append(loop_rate(defaults))
        loop_streamed.append(loop_rate(streamed))
    loop, fit_best = statistics.median(loops), statistics.median(fits_best)
    loop_default, fit_default = statistics.median(loop_defaults), statistics.median(fits_default)
    plain = loop_rate(config.model_copy(update={"jit_compile": False, "steps_per_loop": 1, "unroll_steps": 1}))

    result = {
        "rows": ROWS, "batch_size": BATCH, "epochs": EPOCHS, "model": "16-128-128-2 MLP",
        "input_pipeline_examples_per_sec": round(input_rate(in_memory)),
        "input_pipeline_streamed_examples_per_sec": round(input_rate(None)),
        "loop_examples_per_sec": round(loop),
        "loop_plain_examples_per_sec": round(plain),
        "loop_defaults_examples_per_sec": round(loop_default),
        "fit_default_examples_per_sec": round(fit_default),
        "fit_best_examples_per_sec": round(fit_best),
        "ratio_vs_fit_default": round(loop / fit_default, 3),
        "ratio_vs_fit_best": round(loop / fit_best, 3),
        "ratio_defaults_vs_fit_default": round(loop_default / fit_default, 3),
        "loop_defaults_streamed_examples_per_sec": round(statistics.median(loop_streamed)),
        "ratio_streamed_vs_in_memory": round(statistics.median(loop_streamed) / loop_default, 3),
        "loop_runs_examples_per_sec": [round(r) for r in loops],
        "fit_best_runs_examples_per_sec": [round(r) for r in fits_best],
        "loop_defaults_runs_examples_per_sec": [round(r) for r in loop_defaults],
        "fit_default_runs_examples_per_sec": [round(r) for r in fits_default],
        "loop_defaults_streamed_runs_examples_per_sec": [round(r) for r in loop_streamed],
        "loop_defaults_settings": {"jit_compile": "auto", "steps_per_loop": "auto", "unroll_steps": 1},
        "loop_settings": {"jit_compile": True, "steps_per_loop": STEPS_PER_LOOP, "unroll_steps": UNROLL},
        "fit_best_settings": {"jit_compile": True, "steps_per_execution": STEPS_PER_LOOP},
    }
    result["ratio"] = result["ratio_vs_fit_best"]
    print(" ".join(f"{k}={v}" for k, v in result.items() if not isinstance(v, dict)))
    return result
