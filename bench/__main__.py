"""`python -m bench [--only NAME]`: runs the benchmarks and writes bench/results/NAME.json.

Each benchmark is a module `bench/<name>.py` with `run() -> dict`; figures in one dict are
measured side by side in one process, so their ratios hold even on a noisy shared machine.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

from bench.report import REPORT, write_report
from tracking.system_info import git_commit

BENCHMARKS = ["train", "serving", "tflite", "pipeline"]  # `make bench` (all)
LONG = ["scale", "quality", "shapes", "transform", "slices"]  # long: only when named, e.g. `make bench BENCH=scale`
RESULTS = Path(__file__).resolve().parent / "results"
REPO = RESULTS.parent.parent


def append_run(path: Path, result: dict) -> int:
    """Adds this invocation's figures to the file's `runs` list (never overwritten); returns the
    number of runs kept. A file written before the list existed becomes its first entry."""
    runs = []
    if path.exists():
        old = json.loads(path.read_text())
        runs = old["runs"] if isinstance(old.get("runs"), list) else [old]
    runs.append(result)
    path.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    return len(runs)


VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile")  # what TensorFlow's and oneDNN's kernels pick by


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> dict:
    """The CPU's model name and its vector extensions, from /proc/cpuinfo (empty elsewhere): two
    machines of "the same kind" (2 shared cores) can differ by two in CPU seconds per run."""
    try:
        with open(cpuinfo) as f:
            info = f.read()
    except OSError:
        return {}
    name = re.search(r"^model name\s*:\s*(.*)$", info, re.M)
    flags = re.search(r"^flags\s*:\s*(.*)$", info, re.M)
    return {"cpu_model": name.group(1).strip() if name else None,
            "cpu_vector_flags": [f for f in VECTOR_FLAGS if flags and f in flags.group(1).split()]}


def machine() -> dict:
    import tensorflow as tf

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        **cpu_model(),
        "tensorflow": tf.__version__,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--only", default="all", help=f"one of {BENCHMARKS + LONG} or 'all' ({BENCHMARKS})")
    args = parser.parse_args(argv)
    names = BENCHMARKS if args.only == "all" else [args.only]
    unknown = [n for n in names if n not in BENCHMARKS + LONG]
    if unknown:
        print(f"bench: unknown benchmark {unknown[0]!r}; choose from {BENCHMARKS + LONG}", file=sys.stderr)
        return 2
    RESULTS.mkdir(exist_ok=True)
    # Before this invocation writes its results; the results and the report, which every run
    # rewrites, do not make the measured code '-dirty'.
    commit = git_commit(str(REPO), ignore=tuple(str(path.relative_to(REPO)) for path in (RESULTS, REPORT)
                                                if path.is_relative_to(REPO)))
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        started = time.time()
        result = module.run()
        # What was measured: the code ('-dirty': tracked files differed from the commit) and, in words, BENCH_LABEL.
        result["commit"] = commit
        result["label"] = os.environ.get("BENCH_LABEL", "")
        result["machine"] = machine()
        result["wall_seconds"] = round(time.time() - started, 1)
        result["date"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime(started))
        count = append_run(RESULTS / f"{name}.json", result)
        print(f"bench {name}: run {count} added to {RESULTS / (name + '.json')}")
    print(f"bench: wrote {write_report()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
