"""End-to-end pipeline: a cold run (fresh workspace) against a re-run where every component is
cached, both in this process on the bundled data with the default config."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run() -> dict:
    from pipeline.config import load_config
    from pipeline.local_runner import run_local

    with tempfile.TemporaryDirectory() as root:
        config = load_config(REPO / "loopline.yaml", [f"pipeline.root={root}"])
        started = time.perf_counter()
        cold = run_local(config)
        cold_s = time.perf_counter() - started
        started = time.perf_counter()
        cached = run_local(config)
        cached_s = time.perf_counter() - started
    result = {
        "cold_seconds": round(cold_s, 2),
        "cached_seconds": round(cached_s, 2),
        "ratio_cold_vs_cached": round(cold_s / cached_s, 2),
        "cold_components": cold.executions,
        "cached_components": cached.executions,
        "trainer_epochs": config.trainer.epochs,
    }
    print(f"pipeline: cold {cold_s:.1f}s, cached re-run {cached_s:.1f}s ({result['ratio_cold_vs_cached']}x)")
    return result
