"""The benchmark figures the README and docs/benchmarks.md show, generated from bench/results/*.json.

`python -m bench.figures` rewrites the README's benchmark lines and the tables of
docs/benchmarks.md between their markers; `tests/test_bench_figures.py` fails when the committed
pages differ from what the results say. Adding a figure is one `Figure(...)` line in FIGURES.
"""
from __future__ import annotations

import json
import operator
import re
from dataclasses import dataclass
from pathlib import Path

from bench.report import _figure

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
README = REPO / "README.md"
BENCHMARKS_PAGE = REPO / "docs" / "benchmarks.md"

LIKE_FOR_LIKE, CONTEXT = "like-for-like", "context"


@dataclass(frozen=True)
class Figure:
    what: str  # the row's words
    file: str  # bench/results/<file>.json
    key: str  # dotted key into one run; `[i]` picks a list item, `[rows=1000000]` the item whose rows is 1000000
    fmt: str = "{:.2f}x"  # how the value is written
    target: str = ""  # "<op> <number>" (>=, <=, >, <), judged on each run; "" when there is none
    table: str | None = LIKE_FOR_LIKE  # LIKE_FOR_LIKE, CONTEXT (not like for like, kept for context) or None
    since_run: int = 1  # the range covers runs from this one (1-based): earlier runs measured another thing
    readme: bool = False  # also one line in the README (one headline figure per benchmark)
    runs_with: str = ""  # only the runs holding this key count (e.g. the runs that measured that size)
    out_of: str = ""  # a key whose value in the latest run is written after the figure as "of N"
    runs_where: tuple = ()  # ((key, value), ...): only the runs where each key has its value, or is absent (older runs)


ONE_M, HUNDRED_K = "sizes[rows=1000000]", "sizes[rows=100000]"  # the scale bench's sizes, by their rows

FIGURES = [
    Figure("loop with loopline's default settings vs `model.fit()` with Keras defaults, examples/s", "train",
           "ratio_defaults_vs_fit_default", target=">= 1.16", readme=True),
    Figure("loop at its best (XLA, 32 steps per call, 8 unrolled) vs `fit()` at its best (`steps_per_execution` 32 + XLA)",
           "train", "ratio_vs_fit_best", target=">= 1.0", since_run=5),
    Figure("loop with defaults, split streamed (`in_memory_mb=0`) vs held in memory", "train",
           "ratio_streamed_vs_in_memory", target=">= 0.8"),
    Figure("the loop's share of the machine's float32 matmul peak at its own shapes, a 4 x 1024 MLP, tuned (wall)",
           "train", "loop_fraction_of_matmul_peak.wide_mlp.tuned", "{:.0%}", target=">= 0.5",
           runs_with="loop_fraction_of_matmul_peak"),
    Figure("the same at loopline's default settings", "train", "loop_fraction_of_matmul_peak.wide_mlp.defaults", "{:.0%}",
           runs_with="loop_fraction_of_matmul_peak"),
    Figure("the same for the penguins model (small matmuls, bound by many small ops), defaults", "train",
           "loop_fraction_of_matmul_peak.penguins.defaults", "{:.0%}", runs_with="loop_fraction_of_matmul_peak"),
    Figure("the same for the penguins model, tuned", "train", "loop_fraction_of_matmul_peak.penguins.tuned", "{:.0%}",
           runs_with="loop_fraction_of_matmul_peak"),
    Figure("gRPC server's p50 over a gRPC server that runs no model (grpcio's stock server, pinned to the same core; "
           "ours on its own transport since run 12), 1 client, median of 3 interleaved rounds", "serving", "vs_grpc_floor.p50_over_floor_ms_c1", "{:+.2f} ms",
           target="<= 0.05", runs_with="vs_grpc_floor"),
    Figure("gRPC server's req/s at 16 clients as a fraction of the no-model server's (the same two servers), median "
           "of 3 interleaved rounds",
           "serving", "vs_grpc_floor.req_per_s_fraction_of_floor_c16", "{:.2f}", target=">= 0.7",
           runs_with="vs_grpc_floor"),
    Figure("the same p50 with the model's call answered from a cache (our server's own cost around the model), "
           "1 client", "serving", "vs_grpc_floor.cached_answer_p50_over_floor_ms_c1", "{:+.2f} ms",
           runs_with="vs_grpc_floor.cached_answer_p50_over_floor_ms_c1"),
    Figure("the same req/s fraction with the model's call answered from a cache, 16 clients", "serving",
           "vs_grpc_floor.cached_answer_req_per_s_fraction_c16", "{:.2f}",
           runs_with="vs_grpc_floor.cached_answer_req_per_s_fraction_c16"),
    Figure("the same p50 with the model's float32 TFLite variant served through the interpreter "
           "(`serving.prefer_tflite`), 1 client", "serving", "vs_grpc_floor.tflite_p50_over_floor_ms_c1",
           "{:+.2f} ms", target="<= 0.05", runs_with="vs_grpc_floor.tflite_p50_over_floor_ms_c1"),
    Figure("the same req/s fraction with the TFLite variant, 16 clients", "serving",
           "vs_grpc_floor.tflite_req_per_s_fraction_c16", "{:.2f}", target=">= 0.7",
           runs_with="vs_grpc_floor.tflite_req_per_s_fraction_c16"),
    Figure("embedded REST vs `mlflow models serve`, 16 kept-alive clients, both unpinned, batch 1, our server batching on, req/s", "serving",
           "rest_ratio_vs_mlflow_c16", target=">= 3", readme=True),
    Figure("embedded REST p50, 1 kept-alive client, unpinned", "serving", "loopline_rest.c1.p50_ms", "{:.2f} ms",
           target="<= 2"),
    Figure("embedded REST p50 with the TFLite variant, 1 kept-alive client, unpinned", "serving",
           "loopline_rest_tflite.c1.p50_ms", "{:.2f} ms", runs_with="loopline_rest_tflite"),
    Figure("embedded REST server's CPU per request, 1 kept-alive client (the client's own not counted)", "serving",
           "loopline_rest.c1.server_cpu_us_per_request", "{:.0f} us",
           runs_with="loopline_rest.c1.server_cpu_us_per_request"),
    Figure("`mlflow models serve` p50, 1 kept-alive client, unpinned (the other side)", "serving",
           "mlflow_rest.c1.p50_ms", "{:.2f} ms"),
    Figure("gRPC server's p50 over its own in-process Session call, 1 client", "serving",
           "p50_overhead_vs_session_ms_c1", "{:+.2f} ms", target="<= 0.5"),
    Figure("gRPC server's p50 over a gRPC server that runs no model, 1 client", "serving",
           "grpc_floor_overhead_ms_c1", "{:+.2f} ms"),
    Figure("TFLite dynamic-range latency vs the SavedModel's fastest call (the Session callable), 1 example",
           "tflite", "models.tflite_dynamic_range.latency_1_vs_session", readme=True),
    Figure("TFLite dynamic-range weight bytes vs the SavedModel's (same model)", "tflite",
           "models.tflite_dynamic_range.weight_bytes_vs_saved_model"),
    Figure("TFLite float32 weight bytes vs the SavedModel's", "tflite", "models.tflite_float32.weight_bytes_vs_saved_model"),
    Figure("TFLite float16 weight bytes vs the SavedModel's", "tflite", "models.tflite_float16.weight_bytes_vs_saved_model"),
    Figure("TFLite int8 weight bytes vs the SavedModel's", "tflite", "models.tflite_int8.weight_bytes_vs_saved_model"),
    Figure("`loopline run` vs a bare script (pandas -> tf.data -> `fit` -> `export`), 1M rows, 1 epoch, CPU seconds (process and "
           "children), median of 3 interleaved rounds", "scale", "pipeline_vs_script_cpu_1m", target="<= 1.5", readme=True,
           runs_with=ONE_M),
    Figure("`loopline run` vs a lean script (pandas one-hot outside the model -> `fit` -> `export`), 1M rows, CPU seconds, "
           "median of 3 interleaved rounds", "scale", "pipeline_vs_lean_script_cpu_1m", target="<= 2.5",
           runs_with=ONE_M),
    Figure("`loopline run` vs the bare script, 1M rows, wall", "scale", "pipeline_vs_script_1m", target="<= 3",
           since_run=2, runs_with=ONE_M),
    Figure("`loopline run` vs the lean script, 1M rows, wall", "scale", "pipeline_vs_lean_script_1m", runs_with=ONE_M),
    Figure("`loopline run`, 1M rows, wall", "scale", f"{ONE_M}.pipeline_seconds", "{:.1f} s", since_run=2,
           runs_with=ONE_M),
    Figure("the bare script, 1M rows, wall (the other side)", "scale", f"{ONE_M}.script_seconds", "{:.1f} s",
           since_run=2, runs_with=ONE_M),
    Figure("`loopline run` vs the bare script, 100k rows, wall", "scale", f"{HUNDRED_K}.pipeline_vs_script", since_run=2,
           runs_with=HUNDRED_K),
    Figure("10M rows: peak RSS over the 1M run's, the training split streamed", "scale", "peak_rss_10m_vs_1m",
           target="<= 1.5", runs_with="peak_rss_10m_vs_1m"),
    Figure("10M rows: `loopline run` vs the bare script (tf.data input), CPU seconds (one round)", "scale",
           "pipeline_vs_script_cpu_10m", runs_with="pipeline_vs_script_cpu_10m"),
    Figure("10M rows: `loopline run` vs the lean script, CPU seconds (one round)", "scale",
           "pipeline_vs_lean_script_cpu_10m", runs_with="pipeline_vs_lean_script_cpu_10m"),
    Figure("Arrow ExampleGen vs stock CsvExampleGen, 1M rows, each in a fresh process, wall", "scale",
           "example_gen_arrow_vs_stock_1m", "{:.1f}x", target=">= 10", since_run=2, runs_with=ONE_M),
    Figure("Arrow ExampleGen, 1M rows, wall", "scale", f"{ONE_M}.example_gen.arrow_seconds", "{:.2f} s", since_run=2,
           runs_with=ONE_M),
    Figure("stock CsvExampleGen, 1M rows, wall (the other side)", "scale", f"{ONE_M}.example_gen.stock_seconds",
           "{:.1f} s", since_run=2, runs_with=ONE_M),
    Figure("Arrow ExampleGen vs stock CsvExampleGen, 1M rows, CPU seconds", "scale",
           f"{ONE_M}.example_gen.arrow_vs_stock_cpu", "{:.1f}x", since_run=2, runs_with=ONE_M),
    Figure("ExampleGen (Arrow) memory over its start, 100k rows", "scale", f"{HUNDRED_K}.example_gen.arrow_memory_mb",
           "{:.0f} MB", since_run=2, runs_with=HUNDRED_K),
    Figure("ExampleGen (Arrow) memory over its start, 1M rows", "scale", f"{ONE_M}.example_gen.arrow_memory_mb",
           "{:.0f} MB", since_run=2, runs_with=ONE_M),
    Figure("stock CsvExampleGen memory over its start, 1M rows (the other side)", "scale",
           f"{ONE_M}.example_gen.stock_memory_mb", "{:.0f} MB", since_run=2, runs_with=ONE_M),
    Figure("`loopline run` vs a bare script of the same generic model, a 500-class label, 200k rows, CPU seconds of "
           "the process trees, median of 2 interleaved rounds", "shapes", "many_classes.pipeline_vs_script_cpu"),
    Figure("the same, a wide table (100 number and 10 text columns, 50k rows)", "shapes", "wide.pipeline_vs_script_cpu"),
    Figure("Evaluator in `loopline run`, 1M rows, seconds", "scale", f"{ONE_M}.components.Evaluator.seconds",
           "{:.2f} s", since_run=2, runs_with=ONE_M),
    Figure("Evaluator memory over its start, 1M rows", "scale", f"{ONE_M}.components.Evaluator.memory_mb",
           "{:+.1f} MB", since_run=2, runs_with=ONE_M),
    # Growth needs both sizes: only the runs that measured 100k rows too.
    Figure("Evaluator memory, 1M rows over 100k (32 MB floor)", "scale", "memory_growth.Evaluator", target="<= 1.25",
           runs_with=HUNDRED_K),
    Figure("StatisticsGen memory, 1M rows over 100k (32 MB floor)", "scale", "memory_growth.StatisticsGen",
           target="<= 1.25", runs_with=HUNDRED_K),
    Figure("StatisticsGen alone in a fresh process, memory 1M rows over 100k", "scale",
           "memory_growth.StatisticsGen_alone", target="<= 1.25", runs_with=HUNDRED_K),
    Figure("StatisticsGen alone in a fresh process, memory, 100k rows", "scale",
           f"{HUNDRED_K}.statistics_alone.memory_mb", "{:.1f} MB", runs_with=HUNDRED_K),
    Figure("StatisticsGen alone in a fresh process, memory, 1M rows", "scale", f"{ONE_M}.statistics_alone.memory_mb",
           "{:.1f} MB", runs_with=ONE_M),
    Figure("gRPC server vs `mlflow models serve`, 16 clients, req/s", "serving", "ratio_vs_mlflow_c16", "{:.1f}x",
           table=CONTEXT),
    Figure("gRPC server's p50 over an eager `tf.saved_model.load(...).signatures[...]` call, 1 client", "serving",
           "p50_overhead_ms_c1", "{:+.2f} ms", target="<= 0.5", table=CONTEXT),
    Figure("TFLite dynamic-range latency vs the SavedModel's eager signature call, 1 example", "tflite",
           "models.tflite_dynamic_range.latency_1_vs_saved_model", table=CONTEXT),
    Figure("TFLite dynamic-range file vs the whole SavedModel folder, bytes", "tflite",
           "models.tflite_dynamic_range.size_vs_saved_model", table=CONTEXT),
    Figure("pipeline re-run with every component cached vs cold, wall", "pipeline", "ratio_cold_vs_cached",
           "{:.0f}x faster", table=CONTEXT, readme=True),
    Figure("tables where loopline is within its target of the best scikit-learn baseline ([Model quality](docs/model-quality.md))",
           "quality", "tables_within_target", "{:.0f}", target=">= 7", table=None, readme=True,
           out_of="tables_measured",
           # Every table on the docs' split at the defaults: runs of one table, of other splits (one table's
           # chance), of a variant (QUALITY_SET keys) or with the Tuner on are kept in the results only.
           runs_where=(("split_seed", 0), ("set", []), ("tuner", []), ("tables_measured", 7))),
]

_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


def read_runs(name: str, results: Path = RESULTS) -> list[dict]:
    data = json.loads((results / f"{name}.json").read_text())
    return data["runs"] if isinstance(data.get("runs"), list) else [data]


def value(run: dict, key: str):
    """The figure at `key` in one run (None when absent): report's dotted lookup, plus list items by
    index (`[i]`) or by a field's value (`[rows=1000000]`)."""
    match = re.fullmatch(r"([^\[]*)\[([^\]]+)\]\.?(.*)", key)
    if not match:
        return _figure(run, key)
    head, selector, rest = match.groups()
    items = _figure(run, head)
    if not isinstance(items, list):
        return None
    field, _, wanted = selector.rpartition("=")
    if field:
        item = next((i for i in items if isinstance(i, dict) and str(i.get(field)) == wanted), None)
    else:
        item = items[int(selector)] if -len(items) <= int(selector) < len(items) else None
    return value(item, rest) if rest and item is not None else item


def met(target: str, figure: float) -> bool:
    op, bound = target.split()
    return _OPS[op](figure, float(bound))


class MissingFigure(ValueError):
    pass


def _runs(fig: Figure, results: Path) -> list[dict]:
    return [r for r in read_runs(fig.file, results)[fig.since_run - 1:]
            if (not fig.runs_with or value(r, fig.runs_with) is not None)
            and all(value(r, key) in (None, wanted) for key, wanted in fig.runs_where)]


def measured(fig: Figure, results: Path = RESULTS) -> tuple[float, list[float]]:
    """The latest run's value and the values of every run from `since_run` on that has the figure.
    A figure the latest run lacks is an error naming the file and key (a page never shows a stale one)."""
    runs = _runs(fig, results)
    latest = value(runs[-1], fig.key) if runs else None
    if not isinstance(latest, (int, float)) or isinstance(latest, bool):
        which = f"the latest run holding '{fig.runs_with}'" if fig.runs_with else "the latest run"
        raise MissingFigure(f"bench/results/{fig.file}.json: {which} has no number at '{fig.key}'")
    seen = [value(r, fig.key) for r in runs]
    return latest, [v for v in seen if isinstance(v, (int, float)) and not isinstance(v, bool)]


def _judged(fig: Figure, latest: float, seen: list[float]) -> str:
    if not fig.target:
        return ""
    verdict = "met" if met(fig.target, latest) else "**missed**"
    held = sum(met(fig.target, v) for v in seen)
    return f"{fig.target}: {verdict}" + (f"; met in {held} of {len(seen)} runs" if len(seen) > 1 else "")


def _range(fig: Figure, seen: list[float]) -> str:
    if len(seen) < 2:
        return "1 run"
    runs = f"{len(seen)} runs" + (f" from run {fig.since_run}" if fig.since_run > 1 else "")
    return f"{fig.fmt.format(min(seen))} - {fig.fmt.format(max(seen))} ({runs})"


def table(which: str, results: Path = RESULTS) -> str:
    rows = ["| what | benchmark | latest | range over runs | target |", "|---|---|---|---|---|"]
    for fig in (f for f in FIGURES if f.table == which):
        latest, seen = measured(fig, results)
        rows.append(f"| {fig.what} | `{fig.file}` | {written(fig, latest, results)} | {_range(fig, seen)} | {_judged(fig, latest, seen)} |")
    return "\n".join(rows)


def written(fig: Figure, latest: float, results: Path = RESULTS) -> str:
    """The latest value as the pages show it (with "of N" when the figure counts out of a total)."""
    text = fig.fmt.format(latest)
    if fig.out_of:
        total = value(_runs(fig, results)[-1], fig.out_of)
        if not isinstance(total, (int, float)):
            raise MissingFigure(f"bench/results/{fig.file}.json: the latest run has no number at '{fig.out_of}'")
        text += f" of {total:.0f}"
    return text


def readme_lines(results: Path = RESULTS) -> str:
    lines = []
    for fig in (f for f in FIGURES if f.readme):
        latest, seen = measured(fig, results)
        judged = _judged(fig, latest, seen)
        lines.append(f"- `{fig.file}`: {fig.what}: **{written(fig, latest, results)}**" + (f" (target {judged})" if judged else ""))
    return "\n".join(lines)


def markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"


def sections(results: Path = RESULTS) -> dict[Path, dict[str, str]]:
    """What goes between each page's markers."""
    return {README: {"readme": readme_lines(results)},
            BENCHMARKS_PAGE: {LIKE_FOR_LIKE: table(LIKE_FOR_LIKE, results), CONTEXT: table(CONTEXT, results)}}


def shown(text: str, name: str) -> str:
    start, end = markers(name)
    if start not in text or end not in text:
        raise ValueError(f"the markers {start} ... {end} are missing")
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def replaced(text: str, name: str, body: str) -> str:
    start, end = markers(name)
    head, rest = text.split(start, 1)
    return f"{head}{start}\n{body}\n{end}{rest.split(end, 1)[1]}"


def write_pages(results: Path = RESULTS) -> list[Path]:
    written = []
    for page, bodies in sections(results).items():
        text = page.read_text()
        for name, body in bodies.items():
            text = replaced(text, name, body)
        page.write_text(text)
        written.append(page)
    return written


if __name__ == "__main__":
    for page in write_pages():
        print(f"wrote the benchmark figures into {page.relative_to(REPO)}")
