"""SchemaGen: a tensorflow-metadata Schema (`<uri>/schema.pbtxt`), inferred from the training
split's statistics or imported from a curated file (`data.schema`, like TFX's ImportSchemaGen)."""

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
) -> None:
    """`validation_config` is the `validation:` section as JSON; `curated_sha256` makes the cache
    see edits to the curated schema file."""
    del curated_sha256  # Only there for the cache key.
    from validation.config import ValidationConfig
    from validation.schema import infer_schema, load_schema, write_schema
    from validation.statistics import read_statistics

    if curated_schema:
        result = load_schema(curated_schema)
    else:
        config = ValidationConfig.model_validate_json(validation_config)
        splits = artifact_utils.decode_split_names(statistics.split_names)
        split = INFER_FROM_SPLIT if INFER_FROM_SPLIT in splits else splits[0]
        result = infer_schema(read_statistics(artifact_utils.get_split_uri([statistics], split)), config)
    write_schema(schema.uri, result)
