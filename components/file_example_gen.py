"""ExampleGens for data.format tfrecord, parquet and image_folder: the files of each input split
become tf.Examples (ingestion/file_records.py) and the same artifact as the CSV ExampleGen's: the same
split names, TFX's hash-bucket split rule on the serialized examples, GZIP TFRecords. A Beam
pipeline, one element per file (or per Parquet row group), so `pipeline.beam_args` applies."""
from __future__ import annotations

from typing import Callable, Iterator

import apache_beam as beam
import pyarrow as pa
from tfx.components.example_gen import component as example_gen_component
from tfx.dsl.components.base import executor_spec
from tfx.dsl.io import fileio

from components import csv_example_gen
from ingestion import csv_records, file_records


class _SplitRecords(beam.DoFn):
    def __init__(self, read: Callable[[str], Iterator[list[bytes]]], split_names: list[str], buckets: list[int] | None):
        self._read, self._split_names, self._buckets = read, split_names, buckets

    def process(self, path):
        for records in self._read(path):
            frames = csv_records.split_frames(pa.array(records, pa.large_binary()), self._buckets)
            for name, framed in zip(self._split_names, frames):
                if framed:
                    yield beam.pvalue.TaggedOutput(name, framed)


class _FilesExecutor(csv_example_gen.Executor):
    """The Arrow CSV executor's Do and files; records read by `read(path)`, batches of records."""

    read: Callable[[str], Iterator[list[bytes]]]
    SUMMARIZES = False  # StatisticsGen reads these examples back

    def _examples(self, pipeline, inputs: list[tuple], exec_properties: dict) -> list:
        tagged = []
        for label, pattern, split_names, buckets in inputs:
            files = sorted(fileio.glob(pattern))
            if not files:
                raise RuntimeError(f"Split pattern {pattern} does not match any files.")
            tagged.append(pipeline | f"Files[{label}]" >> beam.Create(files)
                          | f"Read[{label}]" >> beam.ParDo(_SplitRecords(type(self).read, split_names, buckets)).with_outputs(*split_names))
        return tagged


class _ParquetExecutor(_FilesExecutor):
    read = staticmethod(file_records.parquet_records)


class _ImageFolderExecutor(_FilesExecutor):
    read = staticmethod(file_records.image_records)


class _TFRecordExecutor(_FilesExecutor):
    read = staticmethod(file_records.tfrecord_records)


class TFRecordExampleGen(example_gen_component.FileBasedExampleGen):
    """TFX's ImportExampleGen's splits (the same examples in each), with each record checked
    where it is read, so a damaged one is an error naming its file and number."""

    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(_TFRecordExecutor)


class ParquetExampleGen(example_gen_component.FileBasedExampleGen):
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(_ParquetExecutor)


class ImageFolderExampleGen(example_gen_component.FileBasedExampleGen):
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(_ImageFolderExecutor)
