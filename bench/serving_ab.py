"""Two servers side by side on the serving bench's gRPC clients and settings (pinned to one core,
one batch thread, batch 1) at 1 and 16 clients, in interleaved rounds; not part of `make bench`.

    python -m bench.serving_ab supervise [rounds]
        containment's cost: `loopline serve` in one process (serving.supervise=false) vs under
        its supervisor (the default; serving/supervisor.py)
    python -m bench.serving_ab code BEFORE [AFTER] [rounds]
        a change's cost: the server of another checkout of loopline (e.g. `git worktree add
        /tmp/before <commit>`), with its defaults, vs this one's (or AFTER's), with its defaults

Rounds default to 3. Prints, and appends to bench/results/serving_ab.json, each round's figures
and the medians over the rounds of the second side's p50 minus the first's at 1 client and its
req/s over the first's at 16.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.serving import REPO, SERVER_SETTINGS, export_model, ours

RESULTS = REPO / "bench" / "results" / "serving_ab.json"


def _differences(rounds: list[dict], first: str, second: str) -> dict:
    p50 = [round(r[second]["c1"]["p50_ms"] - r[first]["c1"]["p50_ms"], 3) for r in rounds]
    rate = [round(r[second]["c16"]["req_per_s"] / r[first]["c16"]["req_per_s"], 3) for r in rounds]
    return {"p50_difference_ms_c1": round(float(np.median(p50)), 3), "rounds_p50_difference_ms_c1": p50,
            "req_per_s_ratio_c16": round(float(np.median(rate)), 3), "rounds_req_per_s_ratio_c16": rate}


def sides(comparison: str, checkouts: list[str]) -> dict[str, dict]:
    """{side: keyword arguments of bench.serving.ours}, the first side the baseline."""
    if comparison == "supervise":
        return {"plain": {"settings": [*SERVER_SETTINGS, "serving.supervise=false"]},
                "supervised": {"settings": [*SERVER_SETTINGS, "serving.supervise=true"]}}
    before, after = [Path(c).resolve() for c in checkouts] if len(checkouts) == 2 else [Path(checkouts[0]).resolve(), REPO]
    return {"before": {"settings": SERVER_SETTINGS, "repo": before}, "after": {"settings": SERVER_SETTINGS, "repo": after}}


def _commit(checkout: Path) -> str:
    """A checkout named by its commit: a local path says nothing to another reader."""
    import subprocess

    return subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


def run(comparison: str, checkouts: list[str], rounds: int = 3) -> dict:
    from serving.config import ServingConfig
    from serving.config_writer import write_serving_configs

    compared = sides(comparison, checkouts)
    work = Path(tempfile.mkdtemp(prefix="loopline-bench-ab-"))
    try:
        serving_root = work / "serving"
        export_model(serving_root / "penguins" / "1")
        write_serving_configs(str(serving_root), ServingConfig())
        measured = []
        for index in range(rounds):
            order = list(compared) if index % 2 == 0 else list(reversed(compared))  # neither side always first
            measured.append({side: ours(serving_root, **compared[side]) for side in order})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    first, second = compared
    return {"comparison": comparison, "when": time.strftime("%Y-%m-%d %H:%M"), **_differences(measured, first, second),
            "rounds": measured, "sides": {k: {**v, "repo": _commit(v.get("repo", REPO))} for k, v in compared.items()}}


def main(argv: list[str]) -> None:
    comparison, rest = argv[0], argv[1:]
    checkouts = [a for a in rest if not a.isdigit()]
    rounds = [int(a) for a in rest if a.isdigit()]
    result = run(comparison, checkouts, rounds[0] if rounds else 3)
    from bench.__main__ import machine

    result["machine"] = machine()
    runs = json.loads(RESULTS.read_text())["runs"] if RESULTS.exists() else []
    RESULTS.write_text(json.dumps({"runs": [*runs, result]}, indent=1) + "\n")  # the layout bench/report.py reads
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
