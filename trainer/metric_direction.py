"""The one direction rule for metric names: which way a metric improves. A module of its own,
without TensorFlow, so that the configuration's descriptions list the words the rule reads."""
from __future__ import annotations

import re

# A name with one of these words is higher-is-better (TFMA's confusion-matrix metrics that rise as
# a model improves among them); any other name is lower-is-better.
HIGHER_IS_BETTER_WORDS = ("accuracy", "auc", "precision", "recall", "f1", "specificity", "predictive", "threat",
                          "correlation", "true")
# The words as the descriptions list them: "accuracy, auc, ... or true".
HIGHER_IS_BETTER_TEXT = f"{', '.join(HIGHER_IS_BETTER_WORDS[:-1])} or {HIGHER_IS_BETTER_WORDS[-1]}"


def higher_is_better(metric: str) -> bool:
    """The one direction rule for metric names (the ones made here, `<head>_accuracy`, and users'):
    higher is better when a word of the name (split at `_ / - .`) is one of HIGHER_IS_BETTER_WORDS;
    lower otherwise (loss, rmse, mae, weighted_loss, fall_out, false_positives...). Early stopping,
    the Evaluator's champion comparison and the blessing gate all read it."""
    return any(word in HIGHER_IS_BETTER_WORDS for word in re.split(r"[_/\-.]", metric.lower()))
