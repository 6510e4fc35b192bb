"""The candidate's predictions on the eval split, computed once: the Evaluator summarizes them
while it evaluates the candidate (the statistics `loopline monitor` compares served predictions
with) and leaves them in its blessing folder with the model's fingerprint; the BaselineRecorder
takes them when the pushed model has that fingerprint (the same graph, signatures and variables),
and otherwise computes them from the pushed model itself."""
from __future__ import annotations

import logging
import os

PREDICTIONS_FOLDER = "eval_predictions"  # in the blessing folder: FeatureStats.pb, as a statistics split
FINGERPRINT = "eval_predictions_model"  # ModelBlessing property: the fingerprint of the model that predicted them

log = logging.getLogger("loopline")


def fingerprint(saved_model_dir: str) -> str | None:
    """The SavedModel's fingerprint (TensorFlow's singleprint: graph, signatures, objects and
    variables' hashes), None when it has none."""
    import tensorflow as tf

    try:
        return tf.saved_model.experimental.read_fingerprint(saved_model_dir).singleprint()
    except Exception:  # noqa: BLE001 - no fingerprint: the predictions are computed again
        return None


class PredictionSummary:
    """Statistics of the candidate's answers, batch by batch (evaluate_and_decide's candidate_answers)."""

    def __init__(self):
        from validation.statistics import ExampleStatistics

        self._summary = ExampleStatistics()
        self.rows = 0

    def add(self, answer, rows: int, candidate) -> None:
        from trainer.predicted import signature_columns

        self._summary.add_batch(signature_columns(answer, rows, candidate.heads, candidate.output_keys, candidate.logits))
        self.rows += rows

    def write(self, blessing, saved_model_dir: str) -> None:
        """Into the blessing folder, with the fingerprint of `saved_model_dir` (nothing without one)."""
        from trainer.predicted import EVAL_PREDICTIONS
        from validation.statistics import write_statistics

        model = fingerprint(saved_model_dir)
        if model is None or not self.rows:
            return
        write_statistics(recorded_from(blessing), self._summary.result(EVAL_PREDICTIONS))
        blessing.set_string_custom_property(FINGERPRINT, model)


def recorded_from(blessing) -> str:
    """The folder of the statistics the Evaluator recorded."""
    return os.path.join(blessing.uri, PREDICTIONS_FOLDER)


def recorded_predictions(blessing, pushed_dir: str):
    """The statistics the Evaluator recorded, when they are the pushed model's (same fingerprint); else None."""
    from validation.statistics import read_statistics

    if blessing is None or not blessing.has_custom_property(FINGERPRINT):
        return None
    recorded, pushed = blessing.get_string_custom_property(FINGERPRINT), fingerprint(pushed_dir)
    if pushed != recorded:
        log.info("eval predictions computed again: the pushed model (%s) is not the one evaluated (%s)", pushed, recorded)
        return None
    log.info("eval predictions: the Evaluator's, of the same model (fingerprint %s)", recorded)
    return read_statistics(recorded_from(blessing))
