"""Label classes an evaluation split holds that the train split does not.

A classification head's vocabulary is the train split's classes, so an eval example of another
class can never be predicted right: the trainer counts it as `<head>_unseen_label_examples`.
This check says so before training, for every classification label, strings and integers alike
(the statistics keep no value list for an integer column, so the classes are counted from the
examples by the caller). It is reported as TFDV reports a value outside a feature's domain
(ENUM_TYPE_UNEXPECTED_STRING_VALUES: the domain here is the train split's classes), with
severity WARNING: the data is not wrong and the model is not corrupted, only scored lower.
`validation.unseen_label_classes: stop` makes it an ERROR that stops the run.
"""
from __future__ import annotations

from dataclasses import dataclass

from validation.anomalies import Problem

UNSEEN_LABEL_KIND = "ENUM_TYPE_UNEXPECTED_STRING_VALUES"
UNSEEN_LABEL_SHORT = "Label classes not seen in training"


@dataclass
class LabelClasses:
    """One classification label's rows per class, per split."""

    column: str  # the label column, as the data names it
    head: str  # its head's name (the metric prefix)
    by_split: dict[str, dict[str, int]]  # split -> class -> rows


def unseen_label_classes(label: LabelClasses, split: str, train_split: str, example_values: int) -> Problem | None:
    """The problem of `split` holding classes `train_split` never had (None when it holds none)."""
    seen = label.by_split.get(train_split, {})
    counts = label.by_split.get(split, {})
    unseen = sorted((c for c in counts if c not in seen), key=lambda c: (-counts[c], c))
    if not unseen:
        return None
    rows, total = sum(counts[c] for c in unseen), sum(counts.values())
    shown = ", ".join(repr(c) for c in unseen[:example_values])
    more = f" (+{len(unseen) - example_values} more)" if len(unseen) > example_values else ""
    return Problem(split, label.column, UNSEEN_LABEL_KIND,
                   f"classification label '{label.column}' has {len(unseen)} class(es) in split '{split}' that the "
                   f"'{train_split}' split never has: {shown}{more}, in {rows} of {total} labelled examples "
                   f"({rows / total:.1%}); the model cannot predict them (counted as "
                   f"{label.head}_unseen_label_examples).")
