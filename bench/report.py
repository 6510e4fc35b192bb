"""Writes bench/REPORT.md: one table of every figure in bench/results/*.json, with the machine."""
from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _rows(name: str, result: dict, prefix: str = ""):
    """One row per figure; nested figures (per client count, per model) as dotted names."""
    for key, value in result.items():
        if key == "machine" or isinstance(value, list):
            continue
        if isinstance(value, dict):
            yield from _rows(name, value, f"{prefix}{key}.")
            continue
        if isinstance(value, float):
            value = f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
        yield f"| {name} | {prefix}{key} | {value} |"


def write_report(results_dir: Path = HERE / "results", target: Path = HERE / "REPORT.md") -> Path:
    results = {p.stem: json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))}
    lines = ["# Benchmark report", "", "Written by `make bench`; every ratio compares figures measured side by side in one run.", ""]
    machines = {json.dumps(r.get("machine", {}), sort_keys=True) for r in results.values()}
    for machine in machines:
        described = json.loads(machine)
        if described:
            lines.append("Machine: " + ", ".join(f"{k} {v}" for k, v in described.items()))
    lines += ["", "| benchmark | figure | value |", "|---|---|---|"]
    for name, result in results.items():
        lines.extend(_rows(name, result))
    target.write_text("\n".join(lines) + "\n")
    return target
