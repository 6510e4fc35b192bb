"""ExampleGens for data.format parquet and image_folder: the files of each input split become
tf.Examples (ingestion/file_records.py) and the same artifact as the CSV ExampleGen's: the same
split names, TFX's hash-bucket split rule on the serialized examples, GZIP TFRecords. A Beam
pipeline, one element per file (or per Parquet row group), so `pipeline.beam_args` applies."""
from __future__ import annotations

import os
from typing import Any, Callable, Iterator

import apache_beam as beam
from tfx.components.example_gen import component as example_gen_component
from tfx.components.example_gen import utils
from tfx.dsl.components.base import executor_spec
from tfx.dsl.io import fileio
from tfx.proto import example_gen_pb2
from tfx.utils import proto_utils
from tfx.types import standard_component_specs

from components import csv_example_gen
from ingestion import csv_records, file_records


class _SplitRecords(beam.DoFn):
    def __init__(self, read: Callable[[str], Iterator[list[bytes]]], split_names: list[str], buckets: list[int] | None):
        self._read, self._split_names, self._buckets = read, split_names, buckets

    def process(self, path):
        for records in self._read(path):
            parts = csv_records.partition(records, self._buckets) if self._buckets else [records]
            for name, part in zip(self._split_names, parts):
                if part:
                    yield beam.pvalue.TaggedOutput(name, csv_records.tfrecord_frames(part))


class _FilesExecutor(csv_example_gen.Executor):
    """The Arrow CSV executor's Do and files; records read by `read(path)`, batches of records."""

    read: Callable[[str], Iterator[list[bytes]]]

    def _examples(self, pipeline, label: str, pattern: str, split_names: list[str], buckets: list[int] | None):
        files = sorted(fileio.glob(pattern))
        if not files:
            raise RuntimeError(f"Split pattern {pattern} does not match any files.")
        return (pipeline | f"Files[{label}]" >> beam.Create(files)
                | f"Read[{label}]" >> beam.ParDo(_SplitRecords(type(self).read, split_names, buckets)).with_outputs(*split_names))

    def GenerateExamplesByBeam(self, pipeline, exec_properties: dict[str, Any]) -> dict[str, beam.PCollection]:
        input_config = example_gen_pb2.Input()
        proto_utils.json_to_proto(exec_properties[standard_component_specs.INPUT_CONFIG_KEY], input_config)
        output_config = example_gen_pb2.Output()
        proto_utils.json_to_proto(exec_properties[standard_component_specs.OUTPUT_CONFIG_KEY], output_config)
        split_names = utils.generate_output_split_names(input_config, output_config)
        input_base = exec_properties[standard_component_specs.INPUT_BASE_KEY]
        if output_config.split_config.splits:
            buckets, total = [], 0
            for split in output_config.split_config.splits:
                total += split.hash_buckets
                buckets.append(total)
            tagged = self._examples(pipeline, "all", os.path.join(input_base, input_config.splits[0].pattern),
                                    split_names, buckets)
            return {name: tagged[name] for name in split_names}
        return {name: self._examples(pipeline, name, os.path.join(input_base, split.pattern), [name], None)[name]
                for name, split in zip(split_names, input_config.splits)}


class _ParquetExecutor(_FilesExecutor):
    read = staticmethod(file_records.parquet_records)


class _ImageFolderExecutor(_FilesExecutor):
    read = staticmethod(file_records.image_records)


class ParquetExampleGen(example_gen_component.FileBasedExampleGen):
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(_ParquetExecutor)


class ImageFolderExampleGen(example_gen_component.FileBasedExampleGen):
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(_ImageFolderExecutor)
