"""The pipeline at scale: `loopline run` against a bare training script (bench/scale_script.py) on
the same penguins-like CSV (the bundled rows resampled with a little noise, seeded) at 100k and 1M
rows (also 5M with SCALE_5M=1; SCALE_ROWS=2000,20000 picks other sizes, e.g. for a quick check),
same model size, one epoch, batch 256; and the Arrow ExampleGen against the stock CsvExampleGen on
the same file.

The script and `loopline run` each run in their own process, timed from start to exit (imports
included on both sides). The pipeline process's memory (RSS, children included) is sampled every
100 ms; a component's window is read from ML Metadata (execution created -> last updated).

Memory. A component's `memory_mb` is its peak RSS in its window minus the RSS at its start,
floored at 0. In one process that figure can hide memory: a component may reuse what an earlier
one freed to the allocator but did not give back (StatisticsGen once read -23 MB that way). So
the memory growth from the smallest to the largest size is computed on figures floored at
MEMORY_FLOOR_MB (growth below it is allocator noise, not data held), and StatisticsGen is also
measured alone: its Beam pipeline run over the pipeline's train split in a fresh process, peak
RSS minus the RSS just before it starts (`statistics_alone`). The Evaluator is measured in the
pipeline only.

The ExampleGen pair: each executor runs in its own fresh process under the same (default) Beam
options, timed around the executor's `Do` (imports excluded), memory as above. Its CPU seconds
(all threads) are recorded too: on a shared machine wall time swings with the other load, CPU
time much less; `arrow_vs_stock` is the wall-time ratio, `arrow_vs_stock_cpu` the CPU one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BATCH_SIZE, EPOCHS = 256, 1
MEMORY_FLOOR_MB = 32.0


def sizes() -> list[int]:
    if os.environ.get("SCALE_ROWS"):
        return sorted(int(n) for n in os.environ["SCALE_ROWS"].split(","))
    return [100_000, 1_000_000] + ([5_000_000] if os.environ.get("SCALE_5M") == "1" else [])


def make_data(rows: int, path: Path, seed: int = 0) -> None:
    """The bundled rows resampled; numbers moved by 1% of their column's std (integers stay integers)."""
    import numpy as np
    import pandas as pd

    source = pd.read_csv(REPO / "data" / "penguins.csv")
    rng = np.random.default_rng(seed)
    frame = source.sample(rows, replace=True, random_state=seed).reset_index(drop=True)
    for column in frame.columns:
        if frame[column].dtype.kind != "f":
            continue
        noisy = frame[column] + rng.normal(0.0, 0.01 * source[column].std(), rows)
        whole = source[column].dropna().mod(1).eq(0).all()
        frame[column] = noisy.round(0 if whole else 2).astype("Int64" if whole else "float64")
    frame.to_csv(path, index=False)


class RssSampler:
    """Samples a process tree's resident memory every `interval` seconds until it exits."""

    def __init__(self, pid: int, interval: float = 0.1):
        import psutil

        self.samples: list[tuple[float, int]] = []
        self._process = psutil.Process(pid)
        self._interval = interval
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while True:
            try:
                rss = self._process.memory_info().rss + sum(c.memory_info().rss for c in self._process.children(recursive=True))
            except psutil.Error:
                return
            self.samples.append((time.time(), rss))
            time.sleep(self._interval)

    def join(self) -> None:
        self._thread.join(5)


def _timed(args: list[str], log: Path, env: dict | None = None) -> tuple[float, RssSampler]:
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        sampler = RssSampler(proc.pid)
        code = proc.wait()
    seconds = time.perf_counter() - started
    sampler.join()
    if code != 0:
        raise RuntimeError(f"{' '.join(args[:4])}... exited {code}; last lines:\n" + "".join(log.read_text().splitlines(True)[-20:]))
    return seconds, sampler


def component_windows(metadata: Path) -> dict[str, tuple[float, float]]:
    """{node id: (start, end)} in seconds since the epoch, from the newest run in ML Metadata."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = str(metadata)
    store = metadata_store.MetadataStore(config)
    run = max(store.get_contexts_by_type("pipeline_run"), key=lambda c: c.id)
    node_type = store.get_context_type("node").id
    windows = {}
    for execution in store.get_executions_by_context(run.id):
        node = next(c for c in store.get_contexts_by_execution(execution.id) if c.type_id == node_type)
        windows[node.name.split(".", 1)[-1]] = (execution.create_time_since_epoch / 1000, execution.last_update_time_since_epoch / 1000)
    return windows


def component_figures(windows: dict[str, tuple[float, float]], samples: list[tuple[float, int]]) -> dict[str, dict]:
    """Each component's seconds, its memory (peak RSS in its window minus the RSS at its start,
    floored at 0) and the process's peak RSS in its window."""
    figures = {}
    for node, (start, end) in sorted(windows.items(), key=lambda kv: kv[1][0]):
        before = [rss for t, rss in samples if t <= start] or [samples[0][1]]
        during = [rss for t, rss in samples if start <= t <= end] or [before[-1]]
        figures[node] = {"seconds": round(end - start, 2), "memory_mb": round(max(0, max(during) - before[-1]) / 2**20, 1),
                         "peak_rss_mb": round(max(during) / 2**20)}
    return figures


def memory_growth(small: float | None, large: float | None) -> float | None:
    """large / small on figures floored at MEMORY_FLOOR_MB; None when either is missing."""
    if small is None or large is None:
        return None
    return round(max(large, MEMORY_FLOOR_MB) / max(small, MEMORY_FLOOR_MB), 2)


class _PeakRss:
    """This process's peak RSS above its value at the start, sampled every 100 ms, and the CPU
    seconds it used meanwhile (all threads; steadier than wall time on a shared machine)."""

    def __enter__(self):
        import psutil

        self._process = psutil.Process()
        self._cpu = self._process.cpu_times()
        self.start = self.peak = self._process.memory_info().rss
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._done.wait(0.1):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)
        cpu = self._process.cpu_times()
        self.cpu_seconds = round(cpu.user + cpu.system - self._cpu.user - self._cpu.system, 2)

    @property
    def mb(self) -> float:
        return round((self.peak - self.start) / 2**20, 1)


def _in_child(*args: str) -> dict:
    """Runs `python -m bench.scale ARGS` in a fresh process; its figures (the last line, JSON)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-m", "bench.scale", *args], cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"bench.scale {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_size(rows: int, work: Path) -> dict:
    csv = work / f"penguins_{rows}.csv"
    make_data(rows, csv)
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    script_s, _ = _timed([sys.executable, "-m", "bench.scale_script", str(csv), str(work / f"script_{rows}"),
                          str(BATCH_SIZE), str(EPOCHS)], work / f"script_{rows}.log", env)
    root = work / f"root_{rows}"
    pipeline_s, sampler = _timed([sys.executable, "-m", "pipeline.cli", "run", "--config", str(REPO / "loopline.yaml"),
                                  "--set", f"pipeline.root={root}", "--set", f"data.path={csv}",
                                  "--set", f"trainer.epochs={EPOCHS}", "--set", f"trainer.batch_size={BATCH_SIZE}"],
                                 work / f"pipeline_{rows}.log", env)
    components = component_figures(component_windows(root / "metadata.sqlite"), sampler.samples)
    parity = tflite_parity(root)
    seeds = tolerance_seeds(root, csv, env, work / f"seeds_{rows}.log") if rows == max(sizes()) else None
    train_split = sorted(root.glob("tfx/CsvExampleGen/examples/*/Split-train"))[-1]
    statistics_alone = _in_child("statistics", str(train_split / "*"))
    print(f"scale {rows:,} rows: pipeline {pipeline_s:.1f}s, script {script_s:.1f}s ({pipeline_s / script_s:.2f}x); "
          + ", ".join(f"{k} {v['seconds']}s/{v['memory_mb']}MB" for k, v in components.items()), flush=True)
    return {"rows": rows, "script_seconds": round(script_s, 1), "pipeline_seconds": round(pipeline_s, 1),
            "pipeline_vs_script": round(pipeline_s / script_s, 2),
            "peak_rss_mb": round(max(r for _, r in sampler.samples) / 2**20), "components": components,
            "tflite_parity": parity, "tflite_parity_by_seed": seeds, "statistics_alone": statistics_alone,
            "example_gen": example_gen_pair(csv, work / f"example_gen_{rows}")}


def _parity(report: Path) -> dict:
    variants = json.loads(report.read_text())["tflite"]
    return {v["variant"]: {"max_abs_diff": v["max_abs_diff"], "metric_delta": v["metric_delta"], "dropped": v.get("dropped", False)}
            for v in variants}


def _reports(root: Path) -> list[Path]:
    """The Trainer's export reports, oldest execution first (ids sorted as numbers)."""
    return sorted(root.glob("tfx/Trainer/model/*/export_report.json"), key=lambda p: int(p.parent.name))


def tflite_parity(root: Path) -> dict:
    """Each TFLite variant's largest output difference and metric delta in the run's export
    report: what the default tolerances (trainer/export_config.py) are set from."""
    reports = _reports(root)
    return _parity(reports[-1]) if reports else {}


TOLERANCE_SEEDS = (1, 2, 3)  # trainer.seed of the tolerance study's runs
TOLERANCE_MARGIN = 1.5


def tolerance_seeds(root: Path, csv: Path, env: dict, log: Path) -> dict:
    """The default tolerances' method: the run (trainer.seed's default) trained again with three
    more seeds on the same root (ExampleGen to the validator are cached; no variant required, so
    none fails a run), each variant's largest output difference over every seed, times
    TOLERANCE_MARGIN."""
    by_seed = {"default": tflite_parity(root)}
    for seed in TOLERANCE_SEEDS:
        _timed([sys.executable, "-m", "pipeline.cli", "run", "--config", str(REPO / "loopline.yaml"),
                "--set", f"pipeline.root={root}", "--set", f"data.path={csv}", "--set", f"trainer.seed={seed}",
                "--set", f"trainer.epochs={EPOCHS}", "--set", f"trainer.batch_size={BATCH_SIZE}",
                "--set", "export.required_variants=[]"], log, env)
        by_seed[str(seed)] = _parity(_reports(root)[-1])
    largest: dict[str, float] = {}
    for parity in by_seed.values():
        for variant, figures in parity.items():
            largest[variant] = max(largest.get(variant, 0.0), *figures["max_abs_diff"].values())
    return {"seeds": by_seed, "largest_output_diff": largest,
            "suggested_output_tolerance": {v: TOLERANCE_MARGIN * d for v, d in largest.items()}}


def example_gen_pair(csv: Path, work: Path) -> dict:
    """The Arrow and the stock ExampleGen executors on the same file, each in a fresh process."""
    arrow = _in_child("example_gen", "arrow", str(csv), str(work / "arrow"))
    stock = _in_child("example_gen", "stock", str(csv), str(work / "stock"))
    return {"arrow_seconds": arrow["seconds"], "stock_seconds": stock["seconds"],
            "arrow_vs_stock": round(stock["seconds"] / arrow["seconds"], 2),
            "arrow_cpu_seconds": arrow["cpu_seconds"], "stock_cpu_seconds": stock["cpu_seconds"],
            "arrow_vs_stock_cpu": round(stock["cpu_seconds"] / arrow["cpu_seconds"], 2),
            "arrow_memory_mb": arrow["memory_mb"], "stock_memory_mb": stock["memory_mb"]}


def _example_gen_alone(kind: str, csv: str, out: str) -> dict:
    """One ExampleGen executor's Do on the file (single input split, the default 2:1 output)."""
    from tfx.components.example_gen import utils
    from tfx.components.example_gen.csv_example_gen.executor import Executor as StockExecutor
    from tfx.proto import example_gen_pb2
    from tfx.types import standard_artifacts
    from tfx.utils import proto_utils

    from components.csv_example_gen import Executor as ArrowExecutor

    input_config = example_gen_pb2.Input(splits=[example_gen_pb2.Input.Split(name="single_split", pattern=Path(csv).name)])
    properties = {
        "input_base": str(Path(csv).parent),
        "input_config": proto_utils.proto_to_json(input_config),
        "output_config": proto_utils.proto_to_json(utils.make_default_output_config(input_config)),
        "output_data_format": example_gen_pb2.FORMAT_TF_EXAMPLE,
    }
    examples = standard_artifacts.Examples()
    examples.uri = out
    executor = {"arrow": ArrowExecutor, "stock": StockExecutor}[kind]
    with _PeakRss() as memory:
        started = time.perf_counter()
        executor().Do({}, {"examples": [examples]}, properties)
        seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 2), "cpu_seconds": memory.cpu_seconds, "memory_mb": memory.mb}


def _statistics_alone(pattern: str) -> dict:
    """StatisticsGen's Beam pipeline over one split's files (DirectRunner, as in the pipeline)."""
    import apache_beam as beam

    from validation.statistics import StatisticsCombineFn, split_files

    with _PeakRss() as memory:
        started = time.perf_counter()
        with beam.Pipeline() as pipeline:
            _ = pipeline | beam.Create(split_files(pattern)) | beam.CombineGlobally(StatisticsCombineFn("train"))
        seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 2), "cpu_seconds": memory.cpu_seconds, "memory_mb": memory.mb}


def run() -> dict:
    with tempfile.TemporaryDirectory(prefix="loopline-scale-") as tmp:
        results = [run_size(rows, Path(tmp)) for rows in sizes()]
    small, large = results[0], results[-1]
    at_1m = next((r for r in results if r["rows"] == 1_000_000), large)

    def pipeline_memory(size: dict, node: str) -> float | None:
        return size["components"].get(node, {}).get("memory_mb")

    return {
        "pipeline_vs_script_1m": at_1m["pipeline_vs_script"],
        "example_gen_arrow_vs_stock_1m": at_1m["example_gen"]["arrow_vs_stock"],
        "memory_growth": {
            "sizes": [small["rows"], large["rows"]],
            "floor_mb": MEMORY_FLOOR_MB,
            "StatisticsGen": memory_growth(pipeline_memory(small, "StatisticsGen"), pipeline_memory(large, "StatisticsGen")),
            "Evaluator": memory_growth(pipeline_memory(small, "Evaluator"), pipeline_memory(large, "Evaluator")),
            "StatisticsGen_alone": memory_growth(small["statistics_alone"]["memory_mb"], large["statistics_alone"]["memory_mb"]),
        },
        "targets": {"pipeline_vs_script_1m": "<= 3 (moonshot 2)", "example_gen_arrow_vs_stock_1m": ">= 10",
                    "memory_growth": "<= 1.25 for StatisticsGen and Evaluator, largest size over smallest"},
        "sizes": results,
        "settings": {"batch_size": BATCH_SIZE, "epochs": EPOCHS, "config": "loopline.yaml defaults otherwise"},
    }


if __name__ == "__main__":  # a child process: `python -m bench.scale example_gen KIND CSV OUT` or `statistics PATTERN`
    task = {"example_gen": _example_gen_alone, "statistics": _statistics_alone}[sys.argv[1]]
    print(json.dumps(task(*sys.argv[2:])))
