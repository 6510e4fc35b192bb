"""What containment (serving.supervise, serving/supervisor.py) costs per request: `loopline serve`
with the server in one process (serving.supervise=false) and under the supervisor (the default),
the serving bench's gRPC clients and settings (pinned to one core, one batch thread, batch 1) at 1
and 16 clients, in interleaved rounds. Prints the rounds and the medians of their differences; not
part of `make bench`.

    python -m bench.supervisor_cost [rounds]   (3 by default)
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.serving import SERVER_SETTINGS, export_model, ours

SIDES = {"plain": [*SERVER_SETTINGS, "serving.supervise=false"],
         "supervised": [*SERVER_SETTINGS, "serving.supervise=true"]}


def _differences(rounds: list[dict]) -> dict:
    """Supervised minus plain p50 at 1 client (ms) and supervised over plain req/s at 16: each
    round's, and their medians."""
    p50 = [round(r["supervised"]["c1"]["p50_ms"] - r["plain"]["c1"]["p50_ms"], 3) for r in rounds]
    rate = [round(r["supervised"]["c16"]["req_per_s"] / r["plain"]["c16"]["req_per_s"], 3) for r in rounds]
    return {"p50_difference_ms_c1": round(float(np.median(p50)), 3), "rounds_p50_difference_ms_c1": p50,
            "req_per_s_ratio_c16": round(float(np.median(rate)), 3), "rounds_req_per_s_ratio_c16": rate}


def run(rounds: int = 3) -> dict:
    from serving.config import ServingConfig
    from serving.config_writer import write_serving_configs

    work = Path(tempfile.mkdtemp(prefix="loopline-bench-supervisor-"))
    try:
        serving_root = work / "serving"
        export_model(serving_root / "penguins" / "1")
        write_serving_configs(str(serving_root), ServingConfig())
        measured = []
        for index in range(rounds):
            order = list(SIDES) if index % 2 == 0 else list(reversed(SIDES))  # neither side always goes first
            measured.append({side: ours(serving_root, settings=SIDES[side]) for side in order})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {**_differences(measured), "rounds": measured, "settings": SIDES}


if __name__ == "__main__":
    print(json.dumps(run(int(sys.argv[1]) if len(sys.argv) > 1 else 3), indent=2))
