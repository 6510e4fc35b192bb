"""Validation reports the eval split's classification-label classes that the train split lacks,
for integer and string labels alike, as a warning (or, configured, a stopping anomaly). The
examples, statistics and schema are made in the test; no pipeline runs."""
import json

import pytest

from tensorflow_metadata.proto.v0 import anomalies_pb2
from tfx.types import artifact_utils, standard_artifacts

from components.example_validator import _label_classes
from tests.test_validation import write_split
from validation.config import ValidationConfig
from validation.labels import LabelClasses, unseen_label_classes
from validation.run_validation import validate_run
from validation.schema import infer_schema
from validation.statistics import compute_statistics

SEVERITY = anomalies_pb2.AnomalyInfo.Severity
NO_SKEW = ValidationConfig(max_js_divergence=1.0, max_linf_distance=1.0, min_domain_mass=0.0)  # only the label check


def examples_artifact(tmp_path, splits: dict[str, list[dict]]):
    """An Examples artifact laid out as ExampleGen writes it (Split-<name>/*.gz)."""
    examples = standard_artifacts.Examples()
    examples.uri = str(tmp_path / "examples")
    examples.split_names = artifact_utils.encode_split_names(list(splits))
    stats = {}
    for split, rows in splits.items():
        folder = tmp_path / "examples" / f"Split-{split}"
        folder.mkdir(parents=True)
        stats[split] = compute_statistics(write_split(folder / "data.gz", rows), split)
    return examples, stats


def rows(n, classes, offset=0):
    """`n` rows cycling through `classes` for the integer label `digit` and a string label `kind`."""
    return [{"x": float(i + offset), "digit": classes[i % len(classes)], "kind": f"k{classes[i % len(classes)]}"}
            for i in range(n)]


def run_check(tmp_path, label, label_kind="auto", module_file=None, config=None):
    examples, stats = examples_artifact(tmp_path, {"train": rows(60, (0, 1, 2)), "eval": rows(20, (0, 1, 2, 3, 3))})
    config = config or NO_SKEW
    schema = infer_schema(stats["train"], config)
    labels = _label_classes(examples, ["train", "eval"], schema,
                            json.dumps({"label": label, "label_kind": label_kind, "module_file": module_file}))
    return labels, validate_run(stats, schema, "inferred", None, config, labels)


def test_integer_label_declared_classification_reports_the_eval_only_class(tmp_path):
    labels, result = run_check(tmp_path, "digit", "classification")
    assert [(label.column, label.head) for label in labels] == [("digit", "digit")]
    assert labels[0].by_split == {"train": {"0": 20, "1": 20, "2": 20}, "eval": {"0": 4, "1": 4, "2": 4, "3": 8}}
    assert result.stopping == []  # a warning by default: the run goes on
    [warning] = result.warnings
    assert (warning.split, warning.feature, warning.kind) == ("eval", "digit", "ENUM_TYPE_UNEXPECTED_STRING_VALUES")
    assert warning.description == (
        "classification label 'digit' has 1 class(es) in split 'eval' that the 'train' split never has: '3', "
        "in 8 of 20 labelled examples (40.0%); the model cannot predict them (counted as "
        "digit_unseen_label_examples).")
    info = result.anomalies["eval"].anomaly_info["digit"]
    assert info.severity == SEVERITY.WARNING and list(info.path.step) == ["digit"]
    assert "train" not in result.anomalies or "digit" not in result.anomalies["train"].anomaly_info
    assert result.warnings_report() == f"[eval] digit: {warning.description} (ENUM_TYPE_UNEXPECTED_STRING_VALUES)"


def test_integer_label_left_to_auto_is_regression_and_not_checked(tmp_path):
    labels, result = run_check(tmp_path, "digit")
    assert labels == [] and result.warnings == []


def test_a_module_declaring_the_label_a_class_wins_over_auto(tmp_path):
    module = tmp_path / "module.py"
    module.write_text('LABELS = {"digit": "classification"}\n')
    labels, result = run_check(tmp_path, "digit", module_file=str(module))
    assert [label.column for label in labels] == ["digit"]
    assert [w.feature for w in result.warnings] == ["digit"]


def test_string_label_reports_the_eval_only_class_and_stop_makes_it_stop(tmp_path):
    labels, result = run_check(tmp_path, "kind", config=NO_SKEW.model_copy(update={"unseen_label_classes": "stop"}))
    assert labels[0].by_split["eval"] == {"k0": 4, "k1": 4, "k2": 4, "k3": 8}
    assert result.warnings == []
    unseen = [p for p in result.stopping if p.description.startswith("classification label")]
    assert len(unseen) == 1 and "'k3', in 8 of 20 labelled examples (40.0%)" in unseen[0].description
    assert "kind_unseen_label_examples" in unseen[0].description
    assert result.anomalies["eval"].anomaly_info["kind"].severity == SEVERITY.ERROR
    assert "classification label 'kind'" in result.report()  # the text the DataGate stops with


def test_no_report_when_every_eval_class_was_seen():
    label = LabelClasses("y", "y", {"train": {"a": 5, "b": 5}, "eval": {"b": 3}})
    assert unseen_label_classes(label, "eval", "train", 5) is None
    label.by_split["eval"]["c"] = 1
    assert "'c', in 1 of 4 labelled examples (25.0%)" in unseen_label_classes(label, "eval", "train", 5).description


def test_a_label_check_that_cannot_run_stops_only_when_it_is_a_gate(tmp_path, caplog):
    """A module that cannot load: with `warn` the check is skipped with a warning; with `stop` the
    validator fails closed, naming why, instead of passing data it could not check."""
    from components.example_validator import _checked_label_classes

    examples, stats = examples_artifact(tmp_path, {"train": rows(6, (0, 1)), "eval": rows(3, (0, 5))})
    schema = infer_schema(stats["train"], NO_SKEW)
    module = tmp_path / "broken.py"
    module.write_text("def oops(:\n")
    wanted = json.dumps({"label": "digit", "label_kind": "classification", "module_file": str(module)})
    assert _checked_label_classes(examples, ["train", "eval"], schema, wanted, NO_SKEW) == []
    assert "label classes not checked against the train split" in caplog.text
    stop = NO_SKEW.model_copy(update={"unseen_label_classes": "stop"})
    with pytest.raises(RuntimeError, match=r"unseen_label_classes=stop, but the label classes could not be checked"):
        _checked_label_classes(examples, ["train", "eval"], schema, wanted, stop)


def test_string_label_classes_come_from_exact_statistics_without_reading_the_splits(tmp_path, monkeypatch):
    """The statistics' rank histogram counts a string label's classes exactly (Misra-Gries below its
    capacity): the validator takes them from there, the same counts as read from the examples; an
    integer label (no value list in the statistics) is still read."""
    import trainer.inputs

    examples, stats = examples_artifact(tmp_path, {"train": rows(60, (0, 1, 2)), "eval": rows(20, (0, 1, 2, 3, 3))})
    schema = infer_schema(stats["train"], NO_SKEW)
    wanted = json.dumps({"label": "kind", "label_kind": "auto", "module_file": None})
    read = _label_classes(examples, ["train", "eval"], schema, wanted)

    def no_read(*args, **kwargs):
        raise AssertionError("the split was read")

    with monkeypatch.context() as patched:
        patched.setattr(trainer.inputs, "parsed_batches", no_read)
        from_stats = _label_classes(examples, ["train", "eval"], schema, wanted, stats)
        assert from_stats == read
        assert from_stats[0].by_split["eval"] == {"k0": 4, "k1": 4, "k2": 4, "k3": 8}
        digit = json.dumps({"label": "digit", "label_kind": "classification", "module_file": None})
        with pytest.raises(AssertionError, match="the split was read"):
            _label_classes(examples, ["train", "eval"], schema, digit, stats)


def test_statistics_that_are_not_exact_are_not_used(tmp_path):
    """A rank histogram whose counts fall short of the column's values (Misra-Gries dropped some)
    or that shows a replaced non-UTF-8 value is no answer: the classes are then counted from the
    examples."""
    from validation.statistics import exact_class_counts

    examples, stats = examples_artifact(tmp_path, {"train": rows(6, (0, 1)), "eval": rows(3, (0, 1))})
    assert exact_class_counts(stats["train"], "kind") == {"k0": 3, "k1": 3}
    assert exact_class_counts(stats["train"], "digit") is None  # numbers: no value list
    feature = next(f for f in stats["train"].features if f.name == "kind")
    feature.string_stats.rank_histogram.buckets[0].sample_count -= 1
    assert exact_class_counts(stats["train"], "kind") is None
    feature.string_stats.rank_histogram.buckets[0].sample_count += 1
    feature.string_stats.rank_histogram.buckets[0].label = "k\ufffd"
    assert exact_class_counts(stats["train"], "kind") is None
