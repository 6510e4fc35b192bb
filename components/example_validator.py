"""ExampleValidator: checks every split's statistics against the schema, the eval split against
the train split (skew) and every split against the baseline's same split (drift); writes
`<uri>/Split-<name>/SchemaDiff.pb` (tensorflow-metadata Anomalies, with `drift_skew_info`) and the
`blessed` property as TFX's ExampleValidator does, plus `stop`, `report`, `baseline` and
`accepted_changes` for the steps after it.

DataGate stops the pipeline before the Trainer when anomalies stop the run (unless
`validation.warn_only`). It is a step of its own because TFX deletes a failed component's
outputs: the validator must succeed for its anomalies to stay readable (`loopline data report`)."""

import contextlib
import json
import logging

from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component
from tfx.types import artifact_utils
from tfx.types.standard_artifacts import ExampleAnomalies, Examples, ExampleStatistics, Schema

from components.splits import split_pattern


@contextlib.contextmanager
def _quiet(logger_name: str):
    """The Trainer logs its own decisions (e.g. a module for other data); said once is enough."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _label_classes(examples, splits: list[str], schema, labels_config: str, stats: dict | None = None) -> list:
    """Each classification label's rows per class and split, by the Trainer's own rules for which
    columns are labels and of which kind (trainer.model) and how a class is named (trainer.features).
    A string label's counts come from the split's statistics (`stats`, by split) when they are
    exact (validation.statistics.exact_class_counts); otherwise, and for integer labels (the statistics keep no
    value list for them), the split is read and its classes counted."""
    from serving.signature_names import signature_name
    from trainer.features import compute_stats, kinds_from_schema
    from trainer.heads import CLASSIFICATION
    from trainer.inputs import parsed_batches
    from trainer.model import declared_head_kinds, head_kinds, label_names, load_module, module_for_data
    from validation.labels import LabelClasses
    from validation.statistics import exact_class_counts

    wanted = json.loads(labels_config)
    kinds = kinds_from_schema(schema)
    with _quiet("loopline.trainer"):
        module = module_for_data(load_module(wanted.get("module_file")), wanted["label"], kinds, wanted.get("module_file"))
    labels = [name for name in label_names(module, wanted["label"]) if name in kinds]
    heads = head_kinds(labels, kinds, declared_head_kinds(module), wanted.get("label_kind", "auto"))
    columns = [name for name, kind in heads.items() if kind == CLASSIFICATION]
    if not columns:
        return []
    classes = {}
    for split in splits:
        counted = {column: exact_class_counts(stats[split], column) if stats and kinds[column] == "string" else None
                   for column in columns}
        unread = {column: kinds[column] for column, counts in counted.items() if counts is None}
        if unread:  # one read of the split for every label the statistics cannot answer for
            read = compute_stats(parsed_batches(split_pattern(examples, split), unread), unread, classes=list(unread)).classes
            counted.update({column: read[signature_name(column)] for column in unread})
        classes[split] = counted
    return [LabelClasses(column, signature_name(column), {split: classes[split][column] for split in splits})
            for column in columns]


def _checked_label_classes(examples, splits: list[str], schema, labels_config: str, config, stats: dict | None = None) -> list:
    """_label_classes, or [] with a warning when they cannot be counted; with
    validation.unseen_label_classes=stop that check is a gate, and a gate that cannot check says no."""
    if not labels_config:
        return []
    try:
        return _label_classes(examples, splits, schema, labels_config, stats)
    except Exception as exc:
        if config.unseen_label_classes == "stop":
            raise RuntimeError(f"validation.unseen_label_classes=stop, but the label classes could not be "
                               f"checked against the train split: {exc}") from exc
        # warn: a report, not a gate (the Trainer stops on the same error, named)
        logging.getLogger("loopline").warning("label classes not checked against the train split: %s", exc)
        return []


@component
def ExampleValidator(
    statistics: InputArtifact[ExampleStatistics],
    schema: InputArtifact[Schema],
    anomalies: OutputArtifact[ExampleAnomalies],
    validation_config: Parameter[str],
    baseline_dir: Parameter[str] = "",
    baseline_cache_key: Parameter[str] = "",
    examples: InputArtifact[Examples] = None,
    labels_config: Parameter[str] = "",
    module_sha256: Parameter[str] = "",
) -> None:
    """`baseline_dir`: the baseline record's folder ("" for none); `baseline_cache_key` and
    `module_sha256` are only there for the cache key. With `examples` and `labels_config` (JSON:
    data.label, data.label_kind, trainer.module_file), the classification labels' eval classes
    are checked against the train split's."""
    del baseline_cache_key, module_sha256
    from validation.baseline import read_baseline
    from validation.config import ValidationConfig
    from validation.run_validation import validate_run
    from validation.schema import load_schema
    from validation.statistics import read_statistics

    config = ValidationConfig.model_validate_json(validation_config)
    splits = artifact_utils.decode_split_names(statistics.split_names)
    stats = {split: read_statistics(artifact_utils.get_split_uri([statistics], split)) for split in splits}
    baseline = read_baseline(baseline_dir) if baseline_dir else None  # raises if present but unreadable
    source = schema.get_string_custom_property("source") or ("curated" if baseline is None else "baseline")
    run_schema = load_schema(schema.uri)
    labels = _checked_label_classes(examples, splits, run_schema, labels_config, config, stats) if examples is not None else []
    result = validate_run(stats, run_schema, source, baseline, config, labels)

    _record(anomalies, splits, result)
    _log(result, splits)


def _record(anomalies, splits: list[str], result) -> None:
    """Each split's SchemaDiff.pb and `blessed` as TFX's ExampleValidator writes them, and the
    properties the steps after it read (stop, reports, baseline, accepted changes, warnings)."""
    from validation.anomalies import format_problems, has_anomalies, write_anomalies

    anomalies.split_names = artifact_utils.encode_split_names(splits)
    blessed = {}
    for split in splits:
        write_anomalies(artifact_utils.get_split_uri([anomalies], split), result.anomalies[split])
        blessed[split] = 0 if has_anomalies(result.anomalies[split]) else 1
    anomalies.set_json_value_custom_property("blessed", blessed)
    anomalies.set_int_custom_property("anomaly_count", len(result.stopping) + len(result.accepted))
    anomalies.set_int_custom_property("stop", 1 if result.stopping else 0)
    anomalies.set_string_custom_property("report", result.report())
    within = [p for p in result.stopping if not p.against_baseline]
    anomalies.set_string_custom_property("within_run_report", format_problems(within) if within else "")
    anomalies.set_int_custom_property("stopping_against_baseline", len(result.stopping) - len(within))
    anomalies.set_string_custom_property("baseline", result.baseline)
    anomalies.set_string_custom_property("baseline_location", result.baseline_location)
    anomalies.set_string_custom_property("accepted_changes", result.accepted_changes)
    anomalies.set_string_custom_property("warnings", result.warnings_report())


def _log(result, splits: list[str]) -> None:
    from validation.anomalies import format_problems

    log = logging.getLogger("loopline")
    if result.warnings:
        log.warning("data validation warnings (not stopping the run):\n%s", result.warnings_report())
    log.info("data validation: %s", result.baseline)
    if result.stopping:
        log.warning("%s", result.report())
    elif result.accepted:
        log.warning("changes accepted (validation.accept_changes):\n%s", format_problems(result.accepted))
    else:
        log.info("data validation: no anomalies in splits %s", ", ".join(splits))


@component
def DataGate(anomalies: InputArtifact[ExampleAnomalies], warn_only: Parameter[int] = 0) -> None:
    """Raises DataAnomaliesError (with the readable report) when the validator says stop."""
    from validation.anomalies import DataAnomaliesError

    blessed = anomalies.get_json_value_custom_property("blessed") or {}
    stop = anomalies.get_int_custom_property("stop") if anomalies.has_custom_property("stop") else \
        int(not all(int(v) == 1 for v in blessed.values()))
    if not stop:
        return
    report = anomalies.get_string_custom_property("report")
    if warn_only:
        logging.getLogger("loopline").warning("validation.warn_only is set: training goes on despite the anomalies")
        return
    raise DataAnomaliesError(report + "\nThe pipeline stopped before training; fix the data, the schema "
                             "(data.schema) or set validation.warn_only=true.")
