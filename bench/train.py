"""This trainer vs Keras `model.fit` on the same MLP (16-128-128-2), data and input pipeline.

All figures come from one process, side by side: the input pipeline alone (TFRecords ->
parsed batches), fit with default settings, fit at its best (steps_per_execution + XLA), the loop
with loopline's default settings (jit_compile and steps_per_loop "auto"), and the loop at its
best (steps_per_loop inside one tf.function, unroll_steps per XLA call). Steady-state
rates over the last epoch: the first, which compiles and fills caches, is left out.

Then the loop against this machine's own limit (`loop_fraction_of_matmul_peak`): the dense float32
matmul throughput at each model's own shapes, in this process with the training's thread pools,
against the training FLOPs the loop achieves (trainer/flops.py counts them from the model's layers),
for the penguins model on generated rows and for a wide MLP where the matmuls dominate.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time

import numpy as np

ROWS, FEATURES, BATCH, EPOCHS, STEPS_PER_LOOP, UNROLL, REPEATS = 200_000, 16, 256, 2, 32, 8, 3

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PENGUINS_MODULE = os.path.join(REPO, "examples", "penguins", "model.py")
PENGUINS_CSV = os.path.join(REPO, "data", "penguins.csv")
WIDE_STEPS, WIDE_WARM_STEPS = 160, 32  # the wide MLP's run: its rate over steps 33-160
PEAK_SECONDS = 1.0  # each matmul-peak measurement
MATMUL_UNROLL = 8  # rounds of a model's matmuls per compiled call, in the XLA measurement

WIDE_MODULE = '''
import keras
def build_model(ctx):
    inputs = ctx.inputs()
    x = ctx.encoder()(inputs)
    for i in range(4):
        x = keras.layers.Dense(1024, activation="relu", name=f"wide_{i}")(x)
    return keras.Model(inputs, {h.name: h.output_layer(x) for h in ctx.heads})
'''

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
            self.marks.append((time.perf_counter(), step, time.process_time()))

    def rate(self, batch_size: int) -> float:
        (start, first, _), (end, last, _) = self.marks[0], self.marks[-1]
        return (last - first) * batch_size / (end - start)

    def cpu_rate(self, batch_size: int) -> float:
        """Examples per CPU-second of this process (all its threads): steadier than the wall rate
        when other work shares the machine."""
        (_, first, start), (_, last, end) = self.marks[0], self.marks[-1]
        return (last - first) * batch_size / (end - start)

    def close(self):
        pass


def _loop_rates(config, train_path: str, eval_path: str, label: str, warm_after_step: int):
    """(the loop's examples per second and per CPU-second after `warm_after_step`, the trained model)."""
    from trainer.loop import train

    rates = _Rates(warm_after_step=warm_after_step)
    result = train(config, train_path, eval_path, label, metric_sinks=[rates])
    return rates.rate(config.batch_size), rates.cpu_rate(config.batch_size), result.model


def _write_penguins(folder: str, rows: int) -> tuple[str, str]:
    """Penguins-like rows: the bundled complete rows resampled, numbers with 1% noise (seeded)."""
    import pandas as pd
    import tensorflow as tf

    table = pd.read_csv(PENGUINS_CSV).dropna().reset_index(drop=True)
    rng = np.random.default_rng(0)
    numbers = [c for c in table.columns if table[c].dtype == float]
    paths = []
    for split, count in (("train", rows), ("eval", 2048)):
        sample = table.iloc[rng.integers(0, len(table), count)].reset_index(drop=True)
        for c in numbers:
            sample[c] = sample[c] * (1 + 0.01 * rng.standard_normal(count))
        path = os.path.join(folder, f"penguins-{split}.gz")
        with tf.io.TFRecordWriter(path, options="GZIP") as writer:
            for record in sample.to_dict("records"):
                feature = {}
                for name, value in record.items():
                    if isinstance(value, str):
                        feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
                    elif isinstance(value, float):
                        feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
                    else:
                        feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        paths.append(path)
    return paths[0], paths[1]


def matmul_rate(shapes, batch: int, jit: bool, seconds: float = PEAK_SECONDS) -> tuple[float, float]:
    """FLOPs per second and per CPU-second of this process, of the matmuls one training step of
    these Dense shapes runs ((positions, in, out) per layer, as trainer.flops counts them): the
    forward x W, the kernel's gradient x^T dy and the input's dy W^T, in this process's thread
    pools, as the loop runs them. TensorFlow's own kernels: looped in one tf.function. XLA:
    MATMUL_UNROLL rounds in one compiled call, called from Python as the loop calls its compiled
    step (inside a while loop XLA's matmuls measured 3-10x slower here). Each round scales the inputs by a
    value that changes with it, so no compiler can hoist a matmul out of the loop."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    operands, flops = [], 0
    for positions, fan_in, fan_out in shapes:
        rows = batch * positions
        operands.append(tuple(tf.constant(rng.standard_normal(shape, dtype=np.float32))
                              for shape in ((rows, fan_in), (fan_in, fan_out), (rows, fan_out))))
        flops += 3 * 2 * rows * fan_in * fan_out

    def round_(scale, operands):
        total = tf.constant(0.0)
        for x, w, dy in operands:
            x, dy = x * scale, dy * scale
            total += (tf.reduce_sum(tf.matmul(x, w)) + tf.reduce_sum(tf.matmul(x, dy, transpose_a=True))
                      + tf.reduce_sum(tf.matmul(dy, w, transpose_b=True)))
        return total

    @tf.function
    def looped(n, operands):
        total = tf.constant(0.0)
        for i in tf.range(n):
            total += round_(1.0 + tf.cast(i, tf.float32) * 1e-7, operands)
        return total

    @tf.function(jit_compile=True)
    def unrolled(start, operands):
        return tf.add_n([round_(start + i * 1e-7, operands) for i in range(MATMUL_UNROLL)])

    def timed(n: int) -> tuple[float, float]:
        started, cpu = time.perf_counter(), time.process_time()
        if jit:
            for call in range(max(n // MATMUL_UNROLL, 1)):
                unrolled(tf.constant(1.0 + call * 1e-5), operands).numpy()
        else:
            looped(tf.constant(n), operands).numpy()
        return time.perf_counter() - started, time.process_time() - cpu

    timed(MATMUL_UNROLL)  # traces and compiles
    n = max(MATMUL_UNROLL, int(seconds / max(timed(MATMUL_UNROLL)[0] / MATMUL_UNROLL, 1e-6)))
    n -= n % MATMUL_UNROLL
    wall, cpu = timed(n)
    return n * flops / wall, n * flops / cpu


def _threads() -> dict:
    import tensorflow as tf

    return {"intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
            "cpus": len(os.sched_getaffinity(0)), "note": "0: TensorFlow's default (one thread per core)"}


def against_matmul_peak(data: tuple[str, str, str], configs: dict, warm_after_step: int) -> dict:
    """One model's loop at each of `configs` ({name: TrainerConfig}), each run right after the
    matmul peak at the model's shapes is measured (the fastest of TensorFlow's own kernel and
    XLA's), REPEATS times; each setting's fraction is its training FLOPs over the peak's measured
    beside it, per second (wall) and per CPU-second of the process (steadier when other work
    shares the machine), the median of the repeats."""
    from trainer.flops import count_flops
    from trainer.loop import train

    train_path, eval_path, label = data
    runs = {name: {"wall": [], "cpu": [], "examples_per_sec": [], "peak_gflops": [], "xla_peak_gflops": []}
            for name in configs}
    count = None
    for _ in range(REPEATS):
        for name, config in configs.items():
            if count is None:  # the model's shapes, from a first short run (not timed)
                count = count_flops(train(config.model_copy(update={"max_steps": 2}), train_path, eval_path, label).model)
            plain = matmul_rate(count.dense_shapes, config.batch_size, jit=False)
            xla = matmul_rate(count.dense_shapes, config.batch_size, jit=True)
            wall, cpu, _ = _loop_rates(config, train_path, eval_path, label, warm_after_step)
            run = runs[name]
            run["wall"].append(wall * count.training / max(plain[0], xla[0]))
            run["cpu"].append(cpu * count.training / max(plain[1], xla[1]))
            run["examples_per_sec"].append(wall)
            run["peak_gflops"].append(max(plain[0], xla[0]) / 1e9)
            run["xla_peak_gflops"].append(xla[0] / 1e9)
    out = {}
    for name, run in runs.items():
        out[name] = round(statistics.median(run["wall"]), 3)
        out[f"{name}_per_cpu_second"] = round(statistics.median(run["cpu"]), 3)
        out[f"{name}_examples_per_sec"] = round(statistics.median(run["examples_per_sec"]))
        out[f"{name}_gflops"] = round(statistics.median(run["examples_per_sec"]) * count.training / 1e9, 2)
        out[f"{name}_matmul_peak_gflops"] = round(statistics.median(run["peak_gflops"]), 2)
        out[f"{name}_xla_matmul_gflops"] = round(statistics.median(run["xla_peak_gflops"]), 2)
        out[f"{name}_runs"] = {k: [round(v, 3) for v in values] for k, values in run.items()}
    out |= {"training_flops_per_example": count.training, "forward_flops_per_example": count.forward,
            "dense_shapes": [list(s) for s in count.dense_shapes], "uncounted_layers": count.uncounted,
            "settings": {name: {k: getattr(c, k) for k in ("batch_size", "jit_compile", "steps_per_loop", "unroll_steps")}
                         for name, c in configs.items()}}
    return out


def loop_against_machine(folder: str, synthetic: tuple[str, str]) -> dict:
    """`loop_fraction_of_matmul_peak`: the penguins model (examples/penguins/model.py, two heads) on
    generated penguins rows, and a wide MLP (4 x 1024) on the synthetic rows, defaults and tuned."""
    from trainer.config import TrainerConfig

    # Tuned: each model's best settings found here. The small model is bound by per-op costs: XLA,
    # unrolled. The wide one by its matmuls: its step without XLA kept both cores busier (the same
    # FLOPs per CPU-second, more per second), and so had nothing to unroll.
    tuned_small = {"jit_compile": True, "steps_per_loop": STEPS_PER_LOOP, "unroll_steps": UNROLL}
    tuned_wide = {"jit_compile": False, "steps_per_loop": STEPS_PER_LOOP, "unroll_steps": 1}
    # Only what the bench must set: its model, data size and batch; no summaries, no hold-out (the
    # epochs' steps are then known exactly), no early stopping.
    common = {"batch_size": BATCH, "tensorboard": False, "validation_fraction": 0.0, "early_stopping_patience": None}
    penguins = TrainerConfig(module_file=PENGUINS_MODULE, epochs=EPOCHS, **common)
    wide_module = os.path.join(folder, "wide_mlp.py")
    with open(wide_module, "w") as f:
        f.write(WIDE_MODULE)
    wide = TrainerConfig(module_file=wide_module, epochs=1, max_steps=WIDE_STEPS, **common)
    penguins_data = (*_write_penguins(folder, ROWS), "species")
    out = {
        "penguins": against_matmul_peak(penguins_data, {"defaults": penguins, "tuned": penguins.model_copy(update=tuned_small)},
                                        warm_after_step=ROWS // BATCH),
        "wide_mlp": against_matmul_peak((*synthetic, "label"), {"defaults": wide, "tuned": wide.model_copy(update=tuned_wide)},
                                        warm_after_step=WIDE_WARM_STEPS),
    }
    out["threads"] = _threads()
    out["target"] = {"wide_mlp.tuned": ">= 0.5"}
    return out


def run() -> dict:
    import keras
    import tensorflow as tf

    from trainer.config import TrainerConfig
    from trainer.features import compute_stats, infer_feature_kinds
    from trainer.inputs import column_batches, load_in_memory, training_stream
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
        return _loop_rates(trainer_config, train_path, eval_path, "label", steps_per_epoch)[0]

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
    result["loop_fraction_of_matmul_peak"] = loop_against_machine(folder, (train_path, eval_path))
    print(" ".join(f"{k}={v}" for k, v in result.items() if not isinstance(v, dict)))
    for name, figures in result["loop_fraction_of_matmul_peak"].items():
        if "defaults" in figures:
            print(f"  {name}: loop at {figures['defaults']:.1%} of the matmul peak at its shapes with the defaults, "
                  f"{figures['tuned']:.1%} tuned (per CPU-second: {figures['defaults_per_cpu_second']:.1%}, "
                  f"{figures['tuned_per_cpu_second']:.1%}); peak {figures['tuned_matmul_peak_gflops']} GFLOP/s")
    return result
