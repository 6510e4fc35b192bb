"""The Evaluator's cost with slices: evaluate_and_decide on a 1M-row eval split (the bundled
penguins resampled, as tf.Examples), in process, through the server's Session callable as the
Evaluator calls it, without slicing specs and with three (island, sex, body_mass_g buckets),
alternating ROUNDS times in one run. CPU seconds (user + system of this process, all threads)
around the call; the ratio is the median of the rounds' own ratios. Target: with/without <= 2.

`before`: the same call in the code before slices (BEFORE, a commit: its tree extracted with
`git archive` and imported in a child process, same split and model), also alternating: what the
Evaluator cost before, and so what "without" (no specs, but the overall slice's figures, the
confusion matrices and calibration bins now computed) adds.

`make bench BENCH=slices` (~5 min on 2 cores; SLICES_ROWS=20000 for a quick check) adds a run to
bench/results/slices.json.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROUNDS = 3
BEFORE = "65bcfef"  # the last commit before the Evaluator's slices
SPECS = [{"feature_keys": ["island"]}, {"feature_keys": ["sex"]},
         {"feature_buckets": {"body_mass_g": [3500.0, 4500.0, 5500.0]}}]


def write_split(rows: int, path: Path, seed: int = 0) -> None:
    """The bundled rows resampled into GZIP tf.Examples (missing values left missing)."""
    import numpy as np
    import pandas as pd
    import tensorflow as tf

    frame = pd.read_csv(REPO / "data" / "penguins.csv").sample(rows, replace=True, random_state=seed)
    columns = {c: frame[c].to_numpy() for c in ("species", "island", "sex", "bill_length_mm", "flipper_length_mm", "body_mass_g")}
    with tf.io.TFRecordWriter(str(path), options="GZIP") as writer:
        for i in range(rows):
            e = tf.train.Example()
            f = e.features.feature
            for name in ("species", "island", "sex"):
                if isinstance(columns[name][i], str):
                    f[name].bytes_list.value.append(columns[name][i].encode())
            if not np.isnan(columns["bill_length_mm"][i]):
                f["bill_length_mm"].float_list.value.append(columns["bill_length_mm"][i])
            if not np.isnan(columns["flipper_length_mm"][i]):
                f["flipper_length_mm"].int64_list.value.append(int(columns["flipper_length_mm"][i]))
            if not np.isnan(columns["body_mass_g"][i]):
                f["body_mass_g"].float_list.value.append(columns["body_mass_g"][i])
            writer.write(e.SerializeToString())


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(candidate: str, split: str, specs: list) -> dict:
    from serving.signature_call import signature_caller
    from trainer.blessing import evaluate_and_decide
    from trainer.evaluator_config import EvaluatorConfig

    config = EvaluatorConfig.model_validate({"slicing_specs": specs})
    labels = {"species": {"Adelie": 1, "Chinstrap": 1, "Gentoo": 1}, "body_mass_g": 4200.0}
    cpu, wall = cpu_seconds(), time.perf_counter()
    decision = evaluate_and_decide(candidate, split, None, config, open_signature=signature_caller, train_labels=labels)
    return {"cpu_s": round(cpu_seconds() - cpu, 2), "wall_s": round(time.perf_counter() - wall, 2),
            "slices": len(decision.slices["slices"]), "examples": decision.slices["slices"][0]["examples"]}


def run() -> dict:
    from tests.serving_helpers import export_model

    rows = int(os.environ.get("SLICES_ROWS", 1_000_000))
    with tempfile.TemporaryDirectory() as tmp:
        split, candidate = Path(tmp) / "eval.gz", str(export_model(Path(tmp) / "model", kinds={"island": "string"}))
        write_split(rows, split)
        before = _tree(BEFORE, Path(tmp) / "before")
        measure(candidate, str(split), SPECS[:1])  # warm up: imports, first traces
        rounds = [{"before": measure_before(before, candidate, str(split)), "without": measure(candidate, str(split), []),
                   "with_3_specs": measure(candidate, str(split), SPECS)} for _ in range(ROUNDS)]
    ratio = statistics.median(r["with_3_specs"]["cpu_s"] / r["without"]["cpu_s"] for r in rounds)
    ratio_before = statistics.median(r["with_3_specs"]["cpu_s"] / r["before"]["cpu_s"] for r in rounds)
    result = {"rows": rows, "specs": SPECS, "rounds": rounds, "ratio_cpu_with_vs_without": round(ratio, 3),
              "ratio_cpu_with_vs_before": round(ratio_before, 3), "before": BEFORE, "target": "<= 2",
              "cpus": os.cpu_count()}
    print(json.dumps(result, indent=2))
    return result


_BEFORE_SCRIPT = """
import json, resource, sys, time
from serving.signature_call import signature_caller
from trainer.blessing import evaluate_and_decide
from trainer.evaluator_config import EvaluatorConfig
labels = {"species": {"Adelie": 1, "Chinstrap": 1, "Gentoo": 1}, "body_mass_g": 4200.0}
def cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime
evaluate_and_decide(sys.argv[1], sys.argv[2], None, EvaluatorConfig(), open_signature=signature_caller, train_labels=labels)
start, wall = cpu(), time.perf_counter()
evaluate_and_decide(sys.argv[1], sys.argv[2], None, EvaluatorConfig(), open_signature=signature_caller, train_labels=labels)
print(json.dumps({"cpu_s": round(cpu() - start, 2), "wall_s": round(time.perf_counter() - wall, 2)}))
"""


def measure_before(tree: Path, candidate: str, split: str) -> dict:
    """The Evaluator's call in the older tree, in a child process: the second of two calls (the
    first warms it up, as this process's first call does)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _BEFORE_SCRIPT, candidate, split], cwd=tree, capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(tree)}).stdout
    return json.loads(out.strip().splitlines()[-1])


def _tree(commit: str, where: Path) -> Path:
    import io
    import subprocess
    import tarfile

    archive = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    return where


if __name__ == "__main__":
    from bench.__main__ import main

    raise SystemExit(main(["--only", "slices"]))
