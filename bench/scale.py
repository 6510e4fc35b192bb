"""The pipeline at scale: `loopline run` against a bare training script (bench/scale_script.py) on
the same penguins-like CSV (the bundled rows resampled with a little noise, seeded) at 100k and 1M
rows (also 5M with SCALE_5M=1), same model size, one epoch, batch 256; and the Arrow ExampleGen
against the stock CsvExampleGen on the same file.

The script and `loopline run` each run in their own process, timed from start to exit (imports
included on both sides). The pipeline process's memory (RSS, children included) is sampled every
100 ms; a component's figure is its peak minus the value when it started, its window read from
ML Metadata (execution created -> last updated). The two ExampleGen executors run one after the
other in the bench's process (imports done: their own time).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BATCH_SIZE, EPOCHS = 256, 1


def sizes() -> list[int]:
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
    figures = {}
    for node, (start, end) in sorted(windows.items(), key=lambda kv: kv[1][0]):
        before = [rss for t, rss in samples if t <= start] or [samples[0][1]]
        during = [rss for t, rss in samples if start <= t <= end] or [before[-1]]
        figures[node] = {"seconds": round(end - start, 2), "memory_mb": round((max(during) - before[-1]) / 2**20, 1)}
    return figures


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
    print(f"scale {rows:,} rows: pipeline {pipeline_s:.1f}s, script {script_s:.1f}s ({pipeline_s / script_s:.2f}x); "
          + ", ".join(f"{k} {v['seconds']}s/{v['memory_mb']}MB" for k, v in components.items()), flush=True)
    return {"rows": rows, "script_seconds": round(script_s, 1), "pipeline_seconds": round(pipeline_s, 1),
            "pipeline_vs_script": round(pipeline_s / script_s, 2),
            "peak_rss_mb": round(max(r for _, r in sampler.samples) / 2**20), "components": components,
            "tflite_parity": parity,
            "example_gen": example_gen_pair(csv, work / f"example_gen_{rows}")}


def tflite_parity(root: Path) -> dict:
    """Each TFLite variant's largest output difference and metric delta in the run's export
    report: what the default tolerances (trainer/export_config.py) are set from."""
    import json

    reports = sorted(root.glob("tfx/Trainer/model/*/export_report.json"))
    if not reports:
        return {}
    variants = json.loads(reports[-1].read_text())["tflite"]
    return {v["variant"]: {"max_abs_diff": v["max_abs_diff"], "metric_delta": v["metric_delta"], "dropped": v.get("dropped", False)}
            for v in variants}


def example_gen_pair(csv: Path, work: Path) -> dict:
    """The Arrow and the stock ExampleGen executors on the same file, in this process one after
    the other (TensorFlow and Beam already imported: the executors' own time)."""
    from tfx.components.example_gen import utils
    from tfx.components.example_gen.csv_example_gen.executor import Executor as StockExecutor
    from tfx.proto import example_gen_pb2
    from tfx.types import standard_artifacts
    from tfx.utils import proto_utils

    from components.csv_example_gen import Executor as ArrowExecutor

    input_config = example_gen_pb2.Input(splits=[example_gen_pb2.Input.Split(name="single_split", pattern=csv.name)])
    properties = {
        "input_base": str(csv.parent),
        "input_config": proto_utils.proto_to_json(input_config),
        "output_config": proto_utils.proto_to_json(utils.make_default_output_config(input_config)),
        "output_data_format": example_gen_pb2.FORMAT_TF_EXAMPLE,
    }
    seconds = {}
    for kind, executor in (("arrow", ArrowExecutor), ("stock", StockExecutor)):
        examples = standard_artifacts.Examples()
        examples.uri = str(work / kind)
        started = time.perf_counter()
        executor().Do({}, {"examples": [examples]}, dict(properties))
        seconds[kind] = time.perf_counter() - started
    return {"arrow_seconds": round(seconds["arrow"], 1), "stock_seconds": round(seconds["stock"], 1),
            "arrow_vs_stock": round(seconds["stock"] / seconds["arrow"], 2)}


def run() -> dict:
    with tempfile.TemporaryDirectory(prefix="loopline-scale-") as tmp:
        results = [run_size(rows, Path(tmp)) for rows in sizes()]
    by_rows = {r["rows"]: r for r in results}
    small, large = by_rows[100_000], by_rows[1_000_000]

    def growth(node: str) -> float | None:
        base = small["components"].get(node, {}).get("memory_mb")
        top = large["components"].get(node, {}).get("memory_mb")
        return round(top / base, 2) if base and top is not None and base > 0 else None

    return {
        "pipeline_vs_script_1m": large["pipeline_vs_script"],
        "example_gen_arrow_vs_stock_1m": large["example_gen"]["arrow_vs_stock"],
        "memory_growth_1m_vs_100k": {node: growth(node) for node in ("StatisticsGen", "Evaluator")},
        "targets": {"pipeline_vs_script_1m": "<= 3 (moonshot 2)", "example_gen_arrow_vs_stock_1m": ">= 10",
                    "memory_growth_1m_vs_100k": "<= 1.25 for StatisticsGen and Evaluator"},
        "sizes": results,
        "settings": {"batch_size": BATCH_SIZE, "epochs": EPOCHS, "config": "loopline.yaml defaults otherwise"},
    }

