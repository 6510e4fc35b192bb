"""The Transform and Tuner steps' cost at scale (`make bench BENCH=transform`): `loopline run` on
the scale bench's resampled penguins data, one after the other on the same CSV: as it is
(`plain`: loopline's model module, no Transform), loopline's own model behind a Transform
(examples/penguins/preprocessing.py), a TFX module file (bench/transform_module.py: a
preprocessing_fn and a run_fn) through the Transform step, and loopline's search (`tuner`).
Each component's CPU seconds come from the run's process tree sampled in its ML Metadata window
(bench.scale). Like for like: `plain` against `own_model_transform` (the same Trainer), and each
step's CPU seconds against ExampleGen's in the same run. `TRANSFORM_RUNS=plain,tuner` runs some."""
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


# Each run's extra keys; `TRANSFORM_RUNS` (comma-separated) picks some, all by default.
OWN_PREPROCESSING = REPO / "examples" / "penguins" / "preprocessing.py"
RUNS = {
    "plain": [],
    # loopline's own model behind a Transform: the same Trainer as `plain`, like for like.
    "own_model_transform": [f"transform.module_file={OWN_PREPROCESSING}"],
    "run_fn_transform": [f"transform.module_file={MODULE}", f"trainer.module_file={MODULE}", "trainer.train_steps=200",
                         "evaluator.label_key=species_id"],
    # loopline's search of its own model: 4 trials of one epoch each before the Trainer.
    "tuner": ["tuner.enabled=true", "tuner.max_trials=4", "tuner.trial_epochs=1", "tuner.algorithm=random",
              "tuner.search_space={learning_rate: {min: 0.0003, max: 0.01, sampling: log}}"],
}


def run() -> dict:
    rows = int(os.environ.get("TRANSFORM_ROWS", "1000000"))
    names = [n for n in os.environ.get("TRANSFORM_RUNS", ",".join(RUNS)).split(",") if n]
    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        raise SystemExit(f"TRANSFORM_RUNS: unknown run(s) {unknown}; choose from {list(RUNS)}")
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        csv = work / f"penguins_{rows}.csv"
        make_data(rows, csv)
        _add_label_index(csv)
        runs = {name: _run(csv, work, name, RUNS[name], env) for name in names}
    result = {"rows": rows, **runs}
    for name, figures in runs.items():
        components = figures["components"]
        for step in ("Transform", "Tuner"):
            if step in components and components.get("CsvExampleGen"):
                result[f"{name}_{step.lower()}_vs_example_gen_cpu"] = round(components[step] / components["CsvExampleGen"], 2)
        print(f"transform bench {rows:,} rows, {name}: {figures['cpu_seconds']} CPU s; components {components}", flush=True)
    return result
