"""Tables of other shapes than the scale bench's (eight columns, a 3-class label): `loopline run`
with its generic model (trainer.module_file null) against a bare script of the same model
(bench/shapes_script.py) on the same generated CSV, for each shape in SHAPES:

- `many_classes`: a label of 500 classes, 4 number columns and a text column;
- `wide`: 100 number and 10 text columns, a 2-class label.

Each shape runs ROUNDS interleaved rounds (script, then pipeline, one epoch, batch 256); every
process is timed from start to exit (imports included on both sides), in wall and CPU seconds
of its process tree, as in bench/scale.py, whose helpers it uses. A ratio is the median of the
rounds' own ratios. The pipeline's components' CPU seconds come from its ML Metadata windows.
`SHAPES_ROWS=2000` runs every shape at that many rows, e.g. for a quick check.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from bench.scale import BATCH_SIZE, EPOCHS, REPO, _median, _timed, component_figures, component_windows

ROUNDS = 2
SHAPES = {"many_classes": {"rows": 200_000, "numbers": 4, "texts": 1, "classes": 500},
          "wide": {"rows": 50_000, "numbers": 100, "texts": 10, "classes": 2}}
TEXT_VALUES = 8  # distinct values of each text column


def make_data(path: Path, rows: int, numbers: int, texts: int, classes: int, seed: int = 0) -> None:
    """Seeded rows: standard normal numbers (3 decimals, 1% missing), text columns of
    TEXT_VALUES values, and a label `label` of `classes` classes that the first two numbers decide
    (cut into as many bins), so the model has something to learn."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    values = rng.normal(size=(rows, numbers)).round(3)
    score = values[:, 0] + (values[:, 1] if numbers > 1 else 0.0)
    bins = np.quantile(score, np.linspace(0, 1, classes + 1)[1:-1])
    frame = pd.DataFrame(values, columns=[f"n{i}" for i in range(numbers)])
    frame = frame.mask(rng.random(frame.shape) < 0.01)
    for i in range(texts):
        frame[f"t{i}"] = rng.choice([f"v{k}" for k in range(TEXT_VALUES)], rows)
    frame["label"] = [f"c{k}" for k in np.searchsorted(bins, score)]
    frame.to_csv(path, index=False)


def shape_round(csv: Path, work: Path, name: str, env: dict) -> dict:
    """The bare script, then `loopline run` on a fresh root."""
    script = _timed([sys.executable, "-m", "bench.shapes_script", str(csv), str(work / f"script_{name}"),
                     str(BATCH_SIZE), str(EPOCHS)], work / f"script_{name}.log", env)
    root = work / f"root_{name}"
    pipeline = _timed([sys.executable, "-m", "pipeline.cli", "run", "--config", str(REPO / "loopline.yaml"),
                       "--set", f"pipeline.root={root}", "--set", f"data.path={csv}", "--set", "data.label=label",
                       "--set", "trainer.module_file=null", "--set", "pipeline.name=shapes",
                       "--set", "serving.model_name=shapes", "--set", f"trainer.epochs={EPOCHS}",
                       "--set", f"trainer.batch_size={BATCH_SIZE}"], work / f"pipeline_{name}.log", env)
    windows = component_windows(root / "metadata.sqlite")
    return {"pipeline": pipeline.figures(), "script": script.figures(),
            "pipeline_vs_script": round(pipeline.seconds / script.seconds, 2),
            "pipeline_vs_script_cpu": round(pipeline.cpu_seconds / script.cpu_seconds, 2),
            "components_cpu_seconds": {node: figures["cpu_seconds"] for node, figures in
                                       component_figures(windows, pipeline.sampler.samples, pipeline.sampler.cpu).items()}}


def run() -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    rows = int(os.environ.get("SHAPES_ROWS", 0))
    results = {}
    with tempfile.TemporaryDirectory(prefix="loopline-shapes-") as tmp:
        for shape, spec in SHAPES.items():
            spec = {**spec, "rows": rows or spec["rows"]}
            work = Path(tmp) / shape
            work.mkdir()
            csv = work / f"{shape}.csv"
            make_data(csv, **spec)
            rounds = [shape_round(csv, work, str(i), env) for i in range(ROUNDS)]
            results[shape] = {**spec, "rounds": rounds,
                              "pipeline_vs_script": _median([r["pipeline_vs_script"] for r in rounds]),
                              "pipeline_vs_script_cpu": _median([r["pipeline_vs_script_cpu"] for r in rounds])}
    return {"setup": f"generic model, one epoch, batch {BATCH_SIZE}, {ROUNDS} interleaved rounds (script, pipeline)",
            **results}
