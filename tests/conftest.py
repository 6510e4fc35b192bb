"""Shared fixtures: one real pipeline run on the bundled data, reused by every test that reads
its outputs."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a child Python process that must import this checkout's code."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def make_config(root: Path, *overrides: str):
    from pipeline.config import load_config

    return load_config(
        REPO / "loopline.yaml",
        [f"pipeline.root={root}", "trainer.epochs=3", *overrides],
    )


@pytest.fixture(scope="session")
def pipeline_run(tmp_path_factory):
    """Runs the default pipeline once (few epochs); yields (config, summary)."""
    from pipeline.local_runner import run_local

    root = tmp_path_factory.mktemp("workspace")
    config = make_config(root)
    summary = run_local(config)
    return config, summary


@pytest.fixture
def penguins_csv(tmp_path) -> Path:
    """A writable copy of the bundled data."""
    target = tmp_path / "penguins.csv"
    shutil.copy(REPO / "data" / "penguins.csv", target)
    return target
