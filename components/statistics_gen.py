"""StatisticsGen: per-split feature statistics of ExampleGen's output, stored as TFDV stores
them (`<uri>/Split-<name>/FeatureStats.pb`), so the standard component can replace it."""

import logging

from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact
from tfx.dsl.component.experimental.decorators import component
from tfx.types import artifact_utils
from tfx.types.standard_artifacts import Examples, ExampleStatistics

from components.splits import split_pattern


@component
def StatisticsGen(examples: InputArtifact[Examples], statistics: OutputArtifact[ExampleStatistics]) -> None:
    from validation.statistics import compute_statistics, write_statistics

    splits = artifact_utils.decode_split_names(examples.split_names)
    statistics.split_names = artifact_utils.encode_split_names(splits)
    for split in splits:
        stats = compute_statistics(split_pattern(examples, split), name=split)
        path = write_statistics(artifact_utils.get_split_uri([statistics], split), stats)
        logging.getLogger("loopline").info("statistics of split '%s' (%d examples): %s", split, stats.num_examples, path)
