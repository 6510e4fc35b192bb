"""ExampleValidator: checks every split's statistics against the schema and the eval split
against the train split; writes `<uri>/Split-<name>/SchemaDiff.pb` (tensorflow-metadata
Anomalies) and the `blessed` property as TFX's ExampleValidator does.

DataGate stops the pipeline before the Trainer when anomalies were found (unless
`validation.warn_only`). It is a step of its own because TFX deletes a failed component's
outputs: the validator must succeed for its anomalies to stay readable (`loopline data report`)."""

import logging

from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component
from tfx.types import artifact_utils
from tfx.types.standard_artifacts import ExampleAnomalies, ExampleStatistics, Schema

BASELINE_SPLIT = "train"


@component
def ExampleValidator(
    statistics: InputArtifact[ExampleStatistics],
    schema: InputArtifact[Schema],
    anomalies: OutputArtifact[ExampleAnomalies],
    validation_config: Parameter[str],
) -> None:
    from validation.anomalies import format_problems, has_anomalies, validate_split, write_anomalies
    from validation.config import ValidationConfig
    from validation.schema import load_schema
    from validation.statistics import read_statistics

    log = logging.getLogger("loopline")
    config = ValidationConfig.model_validate_json(validation_config)
    expected = load_schema(schema.uri)
    splits = artifact_utils.decode_split_names(statistics.split_names)
    stats = {split: read_statistics(artifact_utils.get_split_uri([statistics], split)) for split in splits}
    baseline = stats.get(BASELINE_SPLIT)
    anomalies.split_names = artifact_utils.encode_split_names(splits)
    blessed, problems = {}, []
    for split in splits:
        result, found = validate_split(split, stats[split], expected, config, None if split == BASELINE_SPLIT else baseline)
        write_anomalies(artifact_utils.get_split_uri([anomalies], split), result)
        blessed[split] = 0 if has_anomalies(result) else 1
        problems += found
    anomalies.set_json_value_custom_property("blessed", blessed)
    anomalies.set_int_custom_property("anomaly_count", len(problems))
    report = format_problems(problems) if problems else ""
    anomalies.set_string_custom_property("report", report)
    if problems:
        log.warning("%s", report)
    else:
        log.info("data validation: no anomalies in splits %s", ", ".join(splits))


@component
def DataGate(anomalies: InputArtifact[ExampleAnomalies], warn_only: Parameter[int] = 0) -> None:
    """Raises DataAnomaliesError (with the readable report) when a split is not blessed."""
    from validation.anomalies import DataAnomaliesError

    blessed = anomalies.get_json_value_custom_property("blessed") or {}
    if all(int(v) == 1 for v in blessed.values()):
        return
    report = anomalies.get_string_custom_property("report")
    if warn_only:
        logging.getLogger("loopline").warning("validation.warn_only is set: training goes on despite the anomalies")
        return
    raise DataAnomaliesError(report + "\nThe pipeline stopped before training; fix the data, the schema "
                             "(data.schema) or set validation.warn_only=true.")
