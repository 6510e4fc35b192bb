"""The candidate's eval predictions are computed once: the Evaluator summarizes them while it
evaluates, and the BaselineRecorder records them when the pushed model is the one evaluated (same
SavedModel fingerprint); the baseline then holds the statistics of what the pushed model predicts
on the eval split, the same as computing them from the pushed folder. Reads the shared pipeline
run; the recomputation takes a few seconds."""
from __future__ import annotations

import glob
import os

from components.baseline_recorder import _eval_predictions
from components.eval_predictions import FINGERPRINT, PREDICTIONS_FOLDER, fingerprint, recorded_predictions
from pipeline.pipeline import data_baseline_dir
from trainer.predicted import EVAL_PREDICTIONS
from validation.baseline import read_baseline


class Blessing:
    """The ModelBlessing's getters the BaselineRecorder uses, over a folder and its properties."""

    def __init__(self, uri: str, properties: dict[str, str]):
        self.uri, self.properties = uri, properties

    def has_custom_property(self, key: str) -> bool:
        return key in self.properties

    def get_string_custom_property(self, key: str) -> str:
        return self.properties[key]


def test_the_baseline_holds_the_pushed_models_predictions_as_the_evaluator_summarized_them(pipeline_run):
    config, summary = pipeline_run
    assert summary.pushed_path is not None
    root = config.pipeline.root
    [blessing_dir] = glob.glob(os.path.join(root, "tfx", "Evaluator", "blessing", "*"))
    assert os.path.exists(os.path.join(blessing_dir, PREDICTIONS_FOLDER, "FeatureStats.pb"))
    [eval_split] = glob.glob(os.path.join(root, "tfx", "CsvExampleGen", "examples", "*", "Split-eval"))

    recomputed = _eval_predictions(summary.pushed_path, os.path.join(eval_split, "*"))
    baseline = read_baseline(data_baseline_dir(config))
    recorded = baseline.statistics[EVAL_PREDICTIONS]
    assert recorded.num_examples > 0 and recorded == recomputed
    # Taken from the Evaluator's folder, not computed twice.
    assert baseline.record["source"][EVAL_PREDICTIONS] == os.path.join(blessing_dir, PREDICTIONS_FOLDER)

    same = Blessing(blessing_dir, {FINGERPRINT: fingerprint(summary.pushed_path)})
    assert recorded_predictions(same, summary.pushed_path) == recomputed
    other = Blessing(blessing_dir, {FINGERPRINT: "another model"})
    assert recorded_predictions(other, summary.pushed_path) is None  # computed again from the pushed model
    assert recorded_predictions(Blessing(blessing_dir, {}), summary.pushed_path) is None
