"""StatisticsGen: per-split feature statistics of ExampleGen's output, stored as TFDV stores
them (`<uri>/Split-<name>/FeatureStats.pb`), so the standard component can replace it.

A split the CSV ExampleGen summarized as it wrote it takes those statistics when its files are the
ones summarized (components/ingest_statistics.py). Any other is read in a Beam pipeline
(`pipeline.beam_args` choose the runner): each file is summarized in bounded memory and the
summaries merged (validation/statistics.py)."""

import logging

import apache_beam as beam
from tfx.dsl.component.experimental.annotations import BeamComponentParameter, InputArtifact, OutputArtifact
from tfx.dsl.component.experimental.decorators import component
from tfx.types import artifact_utils
from tfx.types.standard_artifacts import Examples, ExampleStatistics

from components.splits import split_pattern


@component(use_beam=True)
def StatisticsGen(
    examples: InputArtifact[Examples],
    statistics: OutputArtifact[ExampleStatistics],
    beam_pipeline: BeamComponentParameter[beam.Pipeline] = None,
) -> None:
    from components.ingest_statistics import recorded_statistics
    from validation.statistics import StatisticsCombineFn, split_files, write_statistics

    log = logging.getLogger("loopline")

    def write(stats, split: str, source: str = "read from the examples") -> None:
        path = write_statistics(artifact_utils.get_split_uri([statistics], split), stats)
        log.info("statistics of split '%s' (%d examples, %s): %s", split, stats.num_examples, source, path)

    splits = artifact_utils.decode_split_names(examples.split_names)
    statistics.split_names = artifact_utils.encode_split_names(splits)
    to_read = []
    for split in splits:
        recorded = recorded_statistics(examples, split)
        if recorded is None:
            to_read.append(split)
        else:
            write(recorded, split, "computed while the ExampleGen wrote them")
    with beam_pipeline as pipeline:  # run even when empty: Beam removes its temporary folder as it ends
        for split in to_read:
            (pipeline
             | f"Files[{split}]" >> beam.Create(split_files(split_pattern(examples, split)))
             | f"Summarize[{split}]" >> beam.CombineGlobally(StatisticsCombineFn(split))
             | f"Write[{split}]" >> beam.Map(write, split))
