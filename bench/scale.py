"""The pipeline at scale: `loopline run` against two training scripts on the same penguins-like CSV
(the bundled rows resampled with a little noise, seeded) at 100k and 1M rows (also 5M with
SCALE_5M=1, 10M with SCALE_10M=1; SCALE_ROWS=2000,20000 picks other sizes, e.g. for a quick
check), same model size, one epoch, batch 256: the bare script (bench/scale_script.py, the
encoding inside the model) and the lean one (bench/scale_lean_script.py, pandas one-hot encoding
outside it), both with the validation split loopline holds out. Also the Arrow ExampleGen against
the stock CsvExampleGen on the same file.

Each size runs ROUNDS interleaved rounds (script, lean script, pipeline; one round above BIG rows,
without the stock ExampleGen and the seed runs); every process is timed from start to exit
(imports included on all sides), in wall seconds and in CPU seconds of the process and its
children (the kernel's accounting once it has exited). A ratio is the median of the rounds' own
ratios: on a shared machine wall time swings with the other load, CPU time much less. The
pipeline process's memory (RSS, children included) and CPU seconds are sampled every 100 ms; a
component's window is read from ML Metadata (execution created -> last updated), and the time
outside the components is split into start-up, between components and after the last.
`python -m bench.scale --docs` writes the before/after tables into docs/pipeline-speed.md.

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
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.report import short_commit

REPO = Path(__file__).resolve().parent.parent
BATCH_SIZE, EPOCHS = 256, 1
MEMORY_FLOOR_MB = 32.0
ROUNDS = 3  # interleaved script / lean script / pipeline rounds per size
BIG = 5_000_000  # above: one round, no stock ExampleGen, no seed runs (they would take most of an hour)


def sizes() -> list[int]:
    if os.environ.get("SCALE_ROWS"):
        return sorted(int(n) for n in os.environ["SCALE_ROWS"].split(","))
    return [100_000, 1_000_000] + ([5_000_000] if os.environ.get("SCALE_5M") == "1" else []) \
        + ([10_000_000] if os.environ.get("SCALE_10M") == "1" else [])


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
    """Samples a process tree's resident memory and CPU seconds (user + system, children
    included) every `interval` seconds until it exits."""

    def __init__(self, pid: int, interval: float = 0.1):
        import psutil

        self.samples: list[tuple[float, int]] = []  # (time, RSS bytes)
        self.cpu: list[tuple[float, float]] = []  # (time, CPU seconds so far)
        self._process = psutil.Process(pid)
        self._interval = interval
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while True:
            try:
                children = self._process.children(recursive=True)
                rss, cpu = _usage(self._process)
                command = self._process.cmdline()
            except psutil.Error:
                return  # the process has exited
            for child in children:
                try:
                    child_rss, child_cpu = _usage(child)
                    # A child forked and not yet exec'd shares the parent's pages: its memory is counted once.
                    rss += 0 if child.cmdline() == command else child_rss
                    cpu += child_cpu
                except psutil.Error:
                    continue  # it exited meanwhile
            now = time.time()
            self.samples.append((now, rss))
            self.cpu.append((now, cpu))
            time.sleep(self._interval)

    def join(self) -> None:
        self._thread.join(5)


def _usage(process) -> tuple[int, float]:
    """A process's RSS in bytes and its CPU seconds (user + system)."""
    times = process.cpu_times()
    return process.memory_info().rss, times.user + times.system


@dataclass
class Timed:
    """One process timed from start to exit: wall seconds, CPU seconds (its own and its children's,
    from the kernel's accounting once it has exited), peak RSS, and its samples."""

    started: float  # time.time() at the start
    seconds: float
    cpu_seconds: float
    sampler: RssSampler

    @property
    def peak_rss_mb(self) -> int:
        return round(max((r for _, r in self.sampler.samples), default=0) / 2**20)

    def figures(self) -> dict:
        return {"seconds": round(self.seconds, 2), "cpu_seconds": round(self.cpu_seconds, 2), "peak_rss_mb": self.peak_rss_mb}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(args: list[str], log: Path, env: dict | None = None) -> Timed:
    started, clock, cpu = time.time(), time.perf_counter(), _children_cpu()
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        sampler = RssSampler(proc.pid)
        code = proc.wait()
    seconds, cpu_seconds = time.perf_counter() - clock, _children_cpu() - cpu
    sampler.join()
    if code != 0:
        raise RuntimeError(f"{' '.join(args[:4])}... exited {code}; last lines:\n" + "".join(log.read_text().splitlines(True)[-20:]))
    return Timed(started, seconds, cpu_seconds, sampler)


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


def _at(series: list[tuple[float, float]], moment: float) -> float:
    """A sampled series' last value at or before `moment` (its first value before any sample)."""
    before = [value for t, value in series if t <= moment]
    return before[-1] if before else (series[0][1] if series else 0.0)


def component_figures(windows: dict[str, tuple[float, float]], samples: list[tuple[float, int]],
                      cpu: list[tuple[float, float]] | None = None) -> dict[str, dict]:
    """Each component's seconds, its memory (peak RSS in its window minus the RSS at its start,
    floored at 0), the process's peak RSS in its window and, given the CPU samples, the CPU
    seconds the process tree used in its window (to the 100 ms of the sampling)."""
    figures = {}
    for node, (start, end) in sorted(windows.items(), key=lambda kv: kv[1][0]):
        before = [rss for t, rss in samples if t <= start] or [samples[0][1]]
        during = [rss for t, rss in samples if start <= t <= end] or [before[-1]]
        figures[node] = {"seconds": round(end - start, 2), "memory_mb": round(max(0, max(during) - before[-1]) / 2**20, 1),
                         "peak_rss_mb": round(max(during) / 2**20)}
        if cpu:
            figures[node]["cpu_seconds"] = round(_at(cpu, end) - _at(cpu, start), 2)
    return figures


def outside_components(run: Timed, windows: dict[str, tuple[float, float]]) -> dict[str, dict]:
    """The pipeline process's time outside its components: from its start to the first
    component's (imports, config, building and compiling the pipeline, ML Metadata's start),
    between components (the orchestrator: ML Metadata, resolving inputs, launching), and from the
    last component's end to the exit (the run summary, shutting down)."""
    first, last = min(w[0] for w in windows.values()), max(w[1] for w in windows.values())
    inside = sum(end - start for start, end in windows.values())
    inside_cpu = sum(_at(run.sampler.cpu, end) - _at(run.sampler.cpu, start) for start, end in windows.values())
    ended = run.started + run.seconds
    start_cpu = _at(run.sampler.cpu, first)
    between_cpu = _at(run.sampler.cpu, last) - start_cpu - inside_cpu
    return {
        "start-up": {"seconds": round(first - run.started, 2), "cpu_seconds": round(start_cpu, 2)},
        "between components": {"seconds": round(last - first - inside, 2), "cpu_seconds": round(max(between_cpu, 0.0), 2)},
        "after the last": {"seconds": round(ended - last, 2), "cpu_seconds": round(max(run.cpu_seconds - _at(run.sampler.cpu, last), 0.0), 2)},
    }


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


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def _ratio(pipeline: Timed, reference: Timed, key: str) -> float:
    return round(getattr(pipeline, key) / getattr(reference, key), 2)


def training_split_log(root: Path) -> str:
    """How the Trainer read the training split, as its line in the run's log says: "streamed",
    "in memory" or "unknown"."""
    text = "".join(path.read_text() for path in root.glob("logs/*.log"))
    if "training split streamed" in text:
        return "streamed"
    return "in memory" if "held in memory" in text else "unknown"


def pipeline_round(csv: Path, work: Path, name: str, env: dict) -> dict:
    """The bare script, the lean script and `loopline run` (a fresh root), one after the other."""
    scripts = {script: _timed([sys.executable, "-m", f"bench.{module}", str(csv), str(work / f"{script}_{name}"),
                               str(BATCH_SIZE), str(EPOCHS)], work / f"{script}_{name}.log", env)
               for script, module in (("script", "scale_script"), ("lean_script", "scale_lean_script"))}
    root = work / f"root_{name}"
    log = work / f"pipeline_{name}.log"
    pipeline = _timed([sys.executable, "-m", "pipeline.cli", "run", "--config", str(REPO / "loopline.yaml"),
                       "--set", f"pipeline.root={root}", "--set", f"data.path={csv}",
                       "--set", f"trainer.epochs={EPOCHS}", "--set", f"trainer.batch_size={BATCH_SIZE}"], log, env)
    windows = component_windows(root / "metadata.sqlite")
    return {"root": root,
            "figures": {
                **{who: run.figures() for who, run in {"pipeline": pipeline, **scripts}.items()},
                "pipeline_vs_script": _ratio(pipeline, scripts["script"], "seconds"),
                "pipeline_vs_script_cpu": _ratio(pipeline, scripts["script"], "cpu_seconds"),
                "pipeline_vs_lean_script": _ratio(pipeline, scripts["lean_script"], "seconds"),
                "pipeline_vs_lean_script_cpu": _ratio(pipeline, scripts["lean_script"], "cpu_seconds"),
                "components": component_figures(windows, pipeline.sampler.samples, pipeline.sampler.cpu),
                "outside_components": outside_components(pipeline, windows),
                "training_split": training_split_log(root)}}


def run_size(rows: int, work: Path) -> dict:
    """ROUNDS interleaved rounds of the scripts and the pipeline (one above BIG, without the stock
    ExampleGen and the seed runs); each ratio is the median of the rounds' own ratios."""
    csv = work / f"penguins_{rows}.csv"
    make_data(rows, csv)
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    big = rows > BIG
    rounds = [pipeline_round(csv, work, f"{rows}_{i}", env) for i in range(1 if big else ROUNDS)]
    figures = [r["figures"] for r in rounds]
    # The round whose pipeline CPU seconds are the median gives the per-component figures.
    middle = sorted(rounds, key=lambda r: r["figures"]["pipeline"]["cpu_seconds"])[len(rounds) // 2]
    root = middle["root"]
    result = {"rows": rows, "rounds": figures,
              **{f"{who}_{key}": _median([f[who][key] for f in figures])
                 for who in ("script", "lean_script", "pipeline") for key in ("seconds", "cpu_seconds")},
              **{key: _median([f[key] for f in figures]) for key in
                 ("pipeline_vs_script", "pipeline_vs_script_cpu", "pipeline_vs_lean_script", "pipeline_vs_lean_script_cpu")},
              "peak_rss_mb": max(f["pipeline"]["peak_rss_mb"] for f in figures),
              "components": middle["figures"]["components"], "outside_components": middle["figures"]["outside_components"],
              "training_split": middle["figures"]["training_split"], "tflite_parity": tflite_parity(root)}
    seed_runs = os.environ.get("SCALE_SEED_RUNS", "1") != "0"
    result["tflite_parity_by_seed"] = None if big or rows != seed_size() or not seed_runs else \
        tolerance_seeds(root, csv, env, work / f"seeds_{rows}.log")
    train_split = sorted(root.glob("tfx/CsvExampleGen/examples/*/Split-train"))[-1]
    result["statistics_alone"] = _in_child("statistics", str(train_split / "*"))
    result["example_gen"] = None if big else example_gen_pair(csv, work / f"example_gen_{rows}")
    print(f"scale {rows:,} rows ({len(rounds)} rounds, medians): pipeline {result['pipeline_seconds']}s "
          f"{result['pipeline_cpu_seconds']} CPU s, script {result['script_seconds']}s {result['script_cpu_seconds']} CPU s "
          f"({result['pipeline_vs_script']}x, CPU {result['pipeline_vs_script_cpu']}x), lean script "
          f"{result['lean_script_seconds']}s {result['lean_script_cpu_seconds']} CPU s ({result['pipeline_vs_lean_script']}x, "
          f"CPU {result['pipeline_vs_lean_script_cpu']}x); "
          + ", ".join(f"{k} {v['seconds']}s/{v['cpu_seconds']} CPU s/{v['memory_mb']}MB" for k, v in result["components"].items()),
          flush=True)
    return result


def seed_size() -> int:
    """The size the tolerance study's seed runs use: the largest up to BIG."""
    return max([n for n in sizes() if n <= BIG], default=0)


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


RATIOS = ("pipeline_vs_script", "pipeline_vs_script_cpu", "pipeline_vs_lean_script", "pipeline_vs_lean_script_cpu")
TARGETS = {"pipeline_vs_script_cpu_1m": "<= 1.5 (moonshot 1.2)", "pipeline_vs_lean_script_cpu_1m": "<= 2.5",
           "peak_rss_10m_vs_1m": "<= 1.5, the training split streamed",
           "example_gen_arrow_vs_stock_1m": ">= 10",
           "memory_growth": "<= 1.25 for StatisticsGen and Evaluator, largest size over smallest"}


def headline(results: list[dict], earlier: list[dict] = ()) -> dict:
    """The ratios at 1M and 10M rows, the 10M run's peak RSS over the 1M run's (of this invocation,
    else of the latest earlier run that measured 1M rows, named), the ExampleGen pair."""
    by_rows = {r["rows"]: r for r in results}
    out = {}
    for rows, suffix in ((1_000_000, "1m"), (10_000_000, "10m")):
        if rows in by_rows:
            out.update({f"{key}_{suffix}": by_rows[rows][key] for key in RATIOS})
    if 10_000_000 in by_rows:
        out["training_split_10m"] = by_rows[10_000_000]["training_split"]
        one_m = by_rows.get(1_000_000)
        if one_m is None:
            source = next((r for r in reversed(earlier) if _size(r, 1_000_000)), None)
            if source is not None:
                one_m = _size(source, 1_000_000)
                out["peak_rss_1m_from"] = f"{source.get('label') or 'run'} of {source['date']}"
        if one_m is not None:
            out["peak_rss_10m_vs_1m"] = round(by_rows[10_000_000]["peak_rss_mb"] / one_m["peak_rss_mb"], 2)
    if by_rows.get(1_000_000, {}).get("example_gen"):
        out["example_gen_arrow_vs_stock_1m"] = by_rows[1_000_000]["example_gen"]["arrow_vs_stock"]
    return out


def run() -> dict:
    with tempfile.TemporaryDirectory(prefix="loopline-scale-") as tmp:
        results = [run_size(rows, Path(tmp)) for rows in sizes()]
    small, large = results[0], results[-1]

    def pipeline_memory(size: dict, node: str) -> float | None:
        return size["components"].get(node, {}).get("memory_mb")

    return {
        **headline(results, read_runs()),
        "memory_growth": {
            "sizes": [small["rows"], large["rows"]],
            "floor_mb": MEMORY_FLOOR_MB,
            "StatisticsGen": memory_growth(pipeline_memory(small, "StatisticsGen"), pipeline_memory(large, "StatisticsGen")),
            "Evaluator": memory_growth(pipeline_memory(small, "Evaluator"), pipeline_memory(large, "Evaluator")),
            "StatisticsGen_alone": memory_growth(small["statistics_alone"]["memory_mb"], large["statistics_alone"]["memory_mb"]),
        },
        "targets": TARGETS,
        "sizes": results,
        "settings": {"batch_size": BATCH_SIZE, "epochs": EPOCHS, "rounds": ROUNDS,
                     "seed_runs": os.environ.get("SCALE_SEED_RUNS", "1") != "0",
                     "config": "loopline.yaml defaults otherwise"},
    }


# ---- the docs tables ---------------------------------------------------------------------------

RESULTS = REPO / "bench" / "results" / "scale.json"
DOCS = REPO / "docs" / "pipeline-speed.md"
DOCS_START, DOCS_END = "<!-- scale-tables:start -->", "<!-- scale-tables:end -->"


def _size(run: dict, rows: int) -> dict | None:
    return next((s for s in run.get("sizes", []) if s["rows"] == rows and "rounds" in s), None)


def _pair(runs: list[dict]) -> tuple[dict | None, dict | None]:
    """(before, after): the first run labelled "before" and the latest other run, among the runs
    with CPU figures at 1M rows."""
    measured = [r for r in runs if _size(r, 1_000_000)]
    before = next((r for r in measured if r.get("label", "").startswith("before")), None)
    after = next((r for r in reversed(measured) if r is not before), None)
    return before, after


def _columns(runs: list[dict]) -> list[tuple[str, dict]]:
    """The runs the tables show: before, the measured run before the latest (when there is
    another one: what the latest changes started from) and after (the latest)."""
    before, after = _pair(runs)
    measured = [r for r in runs if _size(r, 1_000_000)]
    previous = next((r for r in reversed(measured) if r is not before and r is not after), None) if after else None
    return [(name, run) for name, run in (("before", before), ("previous", previous), ("after", after)) if run]


def _cell(value) -> str:
    return "" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def component_table(columns: list[tuple[str, dict | None]]) -> str:
    """Seconds and CPU seconds of each part of `loopline run` (the round with the median CPU
    seconds) beside the scripts' medians, one pair of columns per (label, size figures)."""
    parts: list[str] = []
    for _, size in columns:
        outside = [*(size or {}).get("outside_components", {})]
        for name in outside[:1] + [*(size or {}).get("components", {})] + outside[1:]:
            if name not in parts:
                parts.append(name)

    def row(label: str, figures) -> str:
        cells = [" | ".join(_cell(v) for v in figures(size)) if size else " | " for _, size in columns]
        return f"| {label} | " + " | ".join(cells) + " |"

    def part(size, name):
        found = size.get("components", {}).get(name) or size.get("outside_components", {}).get(name) or {}
        return found.get("seconds"), found.get("cpu_seconds")

    lines = ["| part of `loopline run` | " + " | ".join(f"{label} s | {label} CPU s" for label, _ in columns) + " |",
             "|---|" + "---|---|" * len(columns)]
    lines += [row(name, lambda size, n=name: part(size, n)) for name in parts]
    lines.append(row("**whole run (median of the rounds)**", lambda size: (size["pipeline_seconds"], size["pipeline_cpu_seconds"])))
    for who, label in (("script", "bare script (`bench/scale_script.py`)"), ("lean_script", "lean script (`bench/scale_lean_script.py`)")):
        lines.append(row(label, lambda size, w=who: (size[f"{w}_seconds"], size[f"{w}_cpu_seconds"])))
    lines.append(row("peak RSS of `loopline run`, MB", lambda size: (size["peak_rss_mb"], None)))
    return "\n".join(lines) + "\n"


def ratio_table(columns: list[tuple[str, dict]]) -> str:
    keys = [*(f"{key}_1m" for key in RATIOS), "example_gen_arrow_vs_stock_1m"]
    lines = ["| figure | target | " + " | ".join(name for name, _ in columns) + " |", "|---|---|" + "---|" * len(columns)]
    for key in keys:
        if any(key in run for _, run in columns):
            lines.append(f"| `{key}` | {TARGETS.get(key, '')} | " + " | ".join(_cell(run.get(key)) for _, run in columns) + " |")
    return "\n".join(lines) + "\n"


def markdown(runs: list[dict]) -> str:
    """The before/previous/after tables at 1M rows (_columns) and, from the latest run with 10M
    rows, its own table."""
    columns = _columns(runs)
    dates = ", ".join(f"{name}: {run.get('label') or 'run'}"
                      + (f" (commit {short_commit(run['commit'])})" if run.get("commit") else "")
                      + f" of {run['date']} UTC" for name, run in columns)
    out = [f"Runs shown: {dates}.", "", "### Ratios at 1M rows", "", ratio_table(columns),
           "### Where the time goes, 1M rows", "",
           component_table([(label, _size(run, 1_000_000)) for label, run in columns])]
    big = next((r for r in reversed(runs) if _size(r, 10_000_000)), None)
    if big:
        size = _size(big, 10_000_000)
        figures = [f"`{key}` {_cell(big.get(key))}" for key in
                   (*(f"{key}_10m" for key in RATIOS), "peak_rss_10m_vs_1m") if big.get(key) is not None]
        # Else the 1M run measured last before it (the same code, as its label says).
        earlier = [r for r in runs[:runs.index(big)] if _size(r, 1_000_000)]
        one_m = _size(big, 1_000_000) or (_size(earlier[-1], 1_000_000) if earlier else None)
        out += [f"### 10M rows ({big.get('label') or 'run'}, {big['date']} UTC; one round, the training split "
                f"{size['training_split']})", "", "; ".join(figures) + (f" (target for the RSS: {TARGETS['peak_rss_10m_vs_1m']})"
                                     if big.get("peak_rss_10m_vs_1m") is not None else "") + ".",
                "", component_table([("1M", one_m), ("10M", size)])]
    return "\n".join(out)


def read_runs(path: Path = RESULTS) -> list[dict]:
    return json.loads(path.read_text())["runs"] if path.exists() else []


def write_docs(page: Path = DOCS, runs: list[dict] | None = None) -> None:
    """Replaces the page's generated section with `markdown` of the kept runs."""
    text = page.read_text()
    head, rest = text.split(DOCS_START, 1)
    tail = rest.split(DOCS_END, 1)[1]
    page.write_text(f"{head}{DOCS_START}\n{markdown(read_runs() if runs is None else runs).strip()}\n{DOCS_END}{tail}")


if __name__ == "__main__":  # `python -m bench.scale --docs`; a child process: `example_gen KIND CSV OUT` or `statistics PATTERN`
    if sys.argv[1:] == ["--docs"]:
        write_docs()
        print(f"wrote the tables of {RESULTS} into {DOCS}")
        sys.exit(0)
    task = {"example_gen": _example_gen_alone, "statistics": _statistics_alone}[sys.argv[1]]
    print(json.dumps(task(*sys.argv[2:])))
