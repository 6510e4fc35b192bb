"""SchemaGen: a tensorflow-metadata Schema (`<uri>/schema.pbtxt`): the curated file when
`data.schema` is set (like TFX's ImportSchemaGen), else the baseline's schema (the last pushed
run's, see validation.baseline), else inferred from this run's training split (the first run, or
a run accepting changes). The artifact's `source` property says which."""

from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component
from tfx.types import artifact_utils
from tfx.types.standard_artifacts import ExampleStatistics, Schema

INFER_FROM_SPLIT = "train"


@component
def SchemaGen(
    statistics: InputArtifact[ExampleStatistics],
    schema: OutputArtifact[Schema],
    validation_config: Parameter[str],
    curated_schema: Parameter[str] = "",
    curated_sha256: Parameter[str] = "",
    baseline_dir: Parameter[str] = "",
    baseline_cache_key: Parameter[str] = "",
) -> None:
    """`validation_config` is the `validation:` section as JSON; `curated_sha256` and
    `baseline_cache_key` make the cache see edits to the curated file and accepted baselines;
    `baseline_dir` is where the baseline record lives ("" for none)."""
    del curated_sha256, baseline_cache_key  # Only there for the cache key.
    import logging

    from validation.baseline import read_baseline
    from validation.config import ValidationConfig
    from validation.schema import infer_schema, load_schema, write_schema
    from validation.statistics import read_statistics

    config = ValidationConfig.model_validate_json(validation_config)
    baseline = read_baseline(baseline_dir) if baseline_dir else None  # raises if present but unreadable
    if curated_schema:
        result, source = load_schema(curated_schema), "curated"
    elif baseline is not None and not config.accept_changes:
        result, source = baseline.schema, "baseline"
    else:
        splits = artifact_utils.decode_split_names(statistics.split_names)
        split = INFER_FROM_SPLIT if INFER_FROM_SPLIT in splits else splits[0]
        result, source = infer_schema(read_statistics(artifact_utils.get_split_uri([statistics], split)), config), "inferred"
    write_schema(schema.uri, result)
    schema.set_string_custom_property("source", source)
    logging.getLogger("loopline").info("schema: %s%s", source, f" ({baseline.describe()})" if source == "baseline" else "")
