"""Writes bench/REPORT.md: one table of every figure in bench/results/*.json (the latest run), with
the range over every run the file keeps, and the machine."""
from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPORT = HERE / "REPORT.md"


def short_commit(commit: str | None) -> str:
    """A run's commit as the generated pages show it: 7 hex digits, '-dirty' where the tree differed."""
    if not commit:
        return "unknown"
    return commit[:7] + ("-dirty" if commit.endswith("-dirty") else "")


def _format(value):
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return value


def _figure(run: dict, dotted: str):
    for key in dotted.split("."):
        if not isinstance(run, dict) or key not in run:
            return None
        run = run[key]
    return run


def _rows(name: str, result: dict, runs: list[dict], prefix: str = ""):
    """One row per figure of the latest run, with its min-max over the runs; nested figures (per
    client count, per model) as dotted names."""
    for key, value in result.items():
        if key == "machine" or isinstance(value, list):
            continue
        if isinstance(value, dict):
            yield from _rows(name, value, runs, f"{prefix}{key}.")
            continue
        seen = [v for v in (_figure(r, prefix + key) for r in runs) if isinstance(v, (int, float)) and not isinstance(v, bool)]
        spread = f"{_format(min(seen))} - {_format(max(seen))}" if len(seen) > 1 else ""
        yield f"| {name} | {prefix}{key} | {_format(value)} | {spread} | {len(seen) or ''} |"


def write_report(results_dir: Path = HERE / "results", target: Path = REPORT) -> Path:
    history = {p.stem: json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))}
    runs = {name: data["runs"] if isinstance(data.get("runs"), list) else [data] for name, data in history.items()}
    results = {name: kept[-1] for name, kept in runs.items()}
    lines = ["# Benchmark report", "", "Written by `make bench`; every ratio compares figures measured side by side in one run.", ""]
    machines = {json.dumps(r.get("machine", {}), sort_keys=True) for r in results.values()}
    for machine in machines:
        described = json.loads(machine)
        if described:
            lines.append("Machine: " + ", ".join(f"{k} {v}" for k, v in described.items()))
    lines += ["", "| benchmark | figure | latest | range over runs | runs |", "|---|---|---|---|---|"]
    for name, result in results.items():
        lines.extend(_rows(name, result, runs[name]))
    target.write_text("\n".join(lines) + "\n")
    return target
