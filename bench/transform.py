"""The Transform step's cost at scale (`make bench BENCH=transform`): `loopline run` on the scale
bench's resampled penguins data, once as it is (loopline's model module, no Transform) and once
with a TFX module file (bench/transform_module.py: a preprocessing_fn over every column and a
run_fn) through the Transform step, one after the other on the same CSV. Each component's CPU
seconds come from the run's process tree sampled in its ML Metadata window (bench.scale). The
Trainers differ (a custom loop for `trainer.epochs`, a run_fn's fit() for `trainer.train_steps`):
the like-for-like figure is the Transform's own CPU seconds against ExampleGen's in the same run."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from bench.scale import REPO, _timed, component_figures, component_windows, make_data

MODULE = Path(__file__).resolve().parent / "transform_module.py"


def _run(csv: Path, work: Path, name: str, extra: list[str], env: dict) -> dict:
    root = work / f"root_{name}"
    keys = [f"pipeline.root={root}", f"data.path={csv}", "trainer.epochs=1", "trainer.batch_size=4096",
            "export.tflite_variants=[]", *extra]
    run = _timed([sys.executable, "-m", "pipeline.cli", "run", "--config", str(REPO / "loopline.yaml"),
                  *[a for key in keys for a in ("--set", key)]], work / f"{name}.log", env)
    components = component_figures(component_windows(root / "metadata.sqlite"), run.sampler.samples, run.sampler.cpu)
    return {"seconds": round(run.seconds, 2), "cpu_seconds": round(run.cpu_seconds, 2),
            "components": {k: v["cpu_seconds"] for k, v in components.items()}}


def _add_label_index(csv: Path) -> None:
    """`species_id`: the species as 0, 1, 2 (as TFX's penguin data holds it), the label the run_fn's
    model predicts and the Evaluator reads (`evaluator.label_key`); loopline's own run keeps `species`."""
    import pandas as pd

    frame = pd.read_csv(csv)
    frame["species_id"] = frame["species"].astype("category").cat.codes
    frame.to_csv(csv, index=False)


def run() -> dict:
    rows = int(os.environ.get("TRANSFORM_ROWS", "1000000"))
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        csv = work / f"penguins_{rows}.csv"
        make_data(rows, csv)
        _add_label_index(csv)
        plain = _run(csv, work, "plain", [], env)
        transformed = _run(csv, work, "transform", [f"transform.module_file={MODULE}", f"trainer.module_file={MODULE}",
                                                     "trainer.train_steps=200", "evaluator.label_key=species_id"], env)
    transform_cpu = transformed["components"].get("Transform")
    example_gen_cpu = transformed["components"].get("CsvExampleGen")
    result = {"rows": rows, "without_transform": plain, "with_transform": transformed,
              "transform_cpu_seconds": transform_cpu,
              "transform_vs_example_gen_cpu": round(transform_cpu / example_gen_cpu, 2) if example_gen_cpu else None}
    print(f"transform {rows:,} rows: Transform {transform_cpu} CPU s (ExampleGen {example_gen_cpu} in the same run); "
          f"pipeline {plain['cpu_seconds']} CPU s without, {transformed['cpu_seconds']} with", flush=True)
    return result
