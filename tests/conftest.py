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


def run_keys(root: Path, *overrides: str) -> list[str]:
    """The keys a test's run sets: its root, few epochs, then its own."""
    return [f"pipeline.root={root}", "trainer.epochs=3", *overrides]


def make_config(root: Path, *overrides: str):
    from pipeline.config import load_config

    return load_config(REPO / "loopline.yaml", run_keys(root, *overrides))


def loopline_run_child(root: Path, *overrides: str):
    """`loopline run` itself in a child process (the command's deferred imports included) with the
    bundled configuration, make_config's keys and `overrides`; returns (config, the run's summary
    read back from ML Metadata)."""
    import subprocess
    import sys

    from pipeline.local_runner import summarize_run
    from pipeline.run_metadata import newest_finished_run, open_store

    config = make_config(root, *overrides)
    command = [sys.executable, "-m", "pipeline.cli", "run", "--config", str(REPO / "loopline.yaml"),
               *[arg for key in run_keys(root, *overrides) for arg in ("--set", key)]]
    result = subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return config, summarize_run(config, newest_finished_run(open_store(config, read_only=True)).name)


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


def mixed_csv(rows: int, seed: int) -> str:
    """A CSV of numbers with NA, empty, nan and infinite values, UTF-8 text with NA, and a column
    no row has a value in ("nothing")."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lines = ["id,count,ratio,city,code,nothing"]
    for i in range(rows):
        count = "NA" if i % 9 == 0 else str(int(rng.integers(-5, 50)))
        ratio = ["", "nan", "inf", f"{rng.normal(3, 2):.4f}", f"{rng.normal(3, 2):.4f}"][i % 5]
        city = ["Zürich", "Kraków", "NA", "Oslo", "São Paulo"][int(rng.integers(0, 5))]
        lines.append(f"{seed * rows + i},{count},{ratio},{city},c{int(rng.integers(0, 1500))},")
    return "\n".join(lines) + "\n"


def run_csv_example_gen(input_base: Path, out: Path, options=None, splits: dict[str, str] | None = None):
    """The Arrow CSV ExampleGen's executor writing into `out`: one input cut 2:1, or the given
    input splits; its Examples artifact."""
    from tfx.components.example_gen import utils
    from tfx.proto import example_gen_pb2
    from tfx.types import standard_artifacts
    from tfx.utils import proto_utils

    from components.csv_example_gen import Executor, custom_config
    from ingestion.csv_options import CsvOptions

    splits = splits or {"single_split": "*.csv"}
    input_config = example_gen_pb2.Input(splits=[example_gen_pb2.Input.Split(name=n, pattern=p) for n, p in splits.items()])
    output_config = utils.make_default_output_config(input_config) if len(splits) == 1 else example_gen_pb2.Output()
    examples = standard_artifacts.Examples()
    examples.uri = str(out)
    Executor().Do({}, {"examples": [examples]}, {
        "input_base": str(input_base),
        "input_config": proto_utils.proto_to_json(input_config),
        "output_config": proto_utils.proto_to_json(output_config),
        "output_data_format": example_gen_pb2.FORMAT_TF_EXAMPLE,
        "custom_config": proto_utils.proto_to_json(custom_config(options or CsvOptions())),
    })
    return examples
