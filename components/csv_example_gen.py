"""A CSV ExampleGen that reads the file in Arrow record batches (ingestion/csv_records.py) and
writes the stock CsvExampleGen's artifact: the same split names, the same rows in each split
(TFX's hash-bucket rule on the same serialized examples), the same feature types, GZIP TFRecords.

The CSV options (data.na_values, data.delimiter, data.encoding) come in the component's
`custom_config` (a Struct of CsvOptions), so changing one re-runs ExampleGen rather than reusing a
cached artifact. It is still a Beam pipeline (files -> framed tf.Examples per split -> GZIP files), so
`pipeline.beam_args` runs it on Dataflow, Flink or Spark. An element is a file or a block's framed
records, never a row: one step reads, encodes and splits a file block by block, so a runner never
holds record batches between stages and the memory stays that of a block (csv_records.BLOCK_BYTES).
The same step summarizes each block's rows for StatisticsGen (components/ingest_statistics.py), and
each split's writer writes each block's typed columns beside its records for the Trainer
(trainer/handover.py).
"""
from __future__ import annotations

import functools
import os
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filebasedsink import FileBasedSink
from apache_beam.io.filesystem import CompressionTypes
from tfx.components.example_gen import component as example_gen_component
from tfx.components.example_gen import utils
from tfx.components.example_gen.base_example_gen_executor import BaseExampleGenExecutor
from tfx.components.example_gen.write_split import DEFAULT_TF_RECORD_FILE_NAME
from tfx.dsl.components.base import executor_spec
from tfx.dsl.io import fileio
from tfx.proto import example_gen_pb2
from tfx.types import artifact_utils, standard_component_specs
from tfx.utils import proto_utils

from components import ingest_statistics, splits
from components.splits import TRAIN_SPLIT
from ingestion import csv_records
from ingestion.csv_options import CsvOptions


def custom_config(options: CsvOptions) -> example_gen_pb2.CustomConfig:
    """The component's custom_config carrying the CSV options."""
    from google.protobuf import struct_pb2

    config = example_gen_pb2.CustomConfig()
    struct = struct_pb2.Struct()
    struct.update(options.to_dict())
    config.custom_config.Pack(struct)
    return config


def csv_options(exec_properties: dict[str, Any]) -> CsvOptions:
    """The CSV options from the executor's custom_config (none: the defaults)."""
    from google.protobuf import json_format, struct_pb2

    text = exec_properties.get(standard_component_specs.CUSTOM_CONFIG_KEY)
    if not text:
        return CsvOptions()
    config = proto_utils.json_to_proto(text, example_gen_pb2.CustomConfig())
    struct = struct_pb2.Struct()
    config.custom_config.Unpack(struct)
    return CsvOptions.from_dict(json_format.MessageToDict(struct))


class _EncodeAndSplit(beam.DoFn):
    """A file's record batches to TFRecord-framed tf.Examples, one element per batch and output
    split. Reading, encoding and splitting happen in one step, so no record batch is ever an
    element: a runner keeps elements between stages, and would hold the whole file."""

    def __init__(self, names: list[str], options: CsvOptions, split_names: list[str], buckets: list[int] | None):
        self._names = names
        self._options = options
        self._split_names = split_names
        self._buckets = buckets

    def process(self, path: str, types, _every_split_read):
        from validation.statistics import summarize_batch

        for batch in csv_records.read_batches(path, self._names, self._options):
            records, columns = csv_records.encode_with_columns(batch, types)
            frames, split, rows = csv_records.split_records(records, self._buckets)
            for index, (name, framed) in enumerate(zip(self._split_names, frames)):
                if framed:
                    picked = columns.filter(split == index)
                    # The records with their columns, for the Trainer (trainer.handover); the train
                    # split's with each record's hold-out bucket.
                    handed = picked
                    if name == TRAIN_SPLIT:
                        handed = _with_buckets(picked, [rows[i] for i in np.flatnonzero(split == index)])
                    yield beam.pvalue.TaggedOutput(name, (framed, handed))
                    yield beam.pvalue.TaggedOutput(summary_tag(name), summarize_batch(picked))


def _with_buckets(columns: pa.RecordBatch, records: list[bytes]) -> pa.RecordBatch:
    """The columns and each record's hold-out bucket (trainer.holdout.bucket of its bytes)."""
    import tensorflow as tf

    from trainer import handover, holdout

    buckets = holdout.bucket(tf.constant(records, tf.string)).numpy().astype(np.int16)
    return columns.append_column(handover.BUCKET, pa.array(buckets))


def summary_tag(split: str) -> str:
    """The tag of a split's statistics summaries among _EncodeAndSplit's outputs."""
    return f"{split}:summary"


class _FramedRecordsSink(FileBasedSink):
    """Writes elements that are already TFRecord-framed bytes into GZIP files (`.gz`). An element
    (framed bytes, columns) also has its columns written to `columns_dir`, named after the GZIP
    file they go with (trainer.handover)."""

    def __init__(self, file_path_prefix: str, columns_dir: str | None = None):
        super().__init__(file_path_prefix, coder=beam.coders.BytesCoder(), file_name_suffix=".gz",
                         compression_type=CompressionTypes.UNCOMPRESSED)
        self._columns_dir = columns_dir

    def open(self, temp_path: str) -> _RecordsFile:
        from trainer.handover import ColumnsWriter

        return _RecordsFile(csv_records.GzipFile(super().open(temp_path)),
                            ColumnsWriter(self._columns_dir) if self._columns_dir else None)

    def write_record(self, file_handle: _RecordsFile, value) -> None:
        framed, columns = value if isinstance(value, tuple) else (value, None)
        file_handle.records.write(framed)
        if columns is not None and file_handle.columns is not None:
            file_handle.columns.write(columns)


class _RecordsFile:
    """A GZIP records file and the writer of its columns (None: not handed over)."""

    def __init__(self, records: csv_records.GzipFile, columns):
        self.records = records
        self.columns = columns

    def close(self) -> None:
        self.records.close()
        if self.columns is not None:
            self.columns.close(self.records.crc32c, self.records.size)


def _split_files(pattern: str, options: CsvOptions) -> tuple[list[str], list[str], CsvOptions]:
    """The files of one input split, their common header, and the options with the delimiter
    resolved (the same for every file)."""
    files = sorted(fileio.glob(pattern))
    if not files:
        raise RuntimeError(f"Split pattern {pattern} does not match any files.")
    names, resolved = csv_records.read_header(files[0], options)
    for path in files[1:]:
        if csv_records.read_header(path, options) != (names, resolved):
            raise RuntimeError(f"Files in same split {pattern} have different header: {files[0]} and {path}.")
    return files, names, resolved


def _examples(pipeline, inputs: list[tuple], options: CsvOptions) -> list:
    """Each input split's framed records tagged by output split name; `inputs`: (label, file
    pattern, output split names, hash buckets) per input split."""
    reads = []
    for label, pattern, _, _ in inputs:
        files, names, resolved = _split_files(pattern, options)
        paths = pipeline | f"Files[{label}]" >> beam.Create(files)
        # Types need the whole split first; the files are read twice rather than held in memory.
        types = (paths
                 | f"FileTypes[{label}]" >> beam.Map(csv_records.file_types, names, resolved)
                 | f"InferTypes[{label}]" >> beam.CombineGlobally(lambda found: functools.reduce(csv_records.merge_types, found, {})))
        reads.append((paths, names, resolved, types))
    # Encoding waits for every input split's type pass (a side input), so a file that cannot be
    # read or decoded stops the run before any example is written.
    everything_read = beam.pvalue.AsList([types for *_, types in reads] | "EverySplitRead" >> beam.Flatten())
    return [paths | f"Encode[{label}]" >> beam.ParDo(_EncodeAndSplit(names, resolved, split_names, buckets),
                                                     beam.pvalue.AsSingleton(types), everything_read)
            .with_outputs(*split_names, *map(summary_tag, split_names))
            for (label, _, split_names, buckets), (paths, names, resolved, types) in zip(inputs, reads)]


class Executor(BaseExampleGenExecutor):
    """The stock executor's Do, with batch elements from input to files, and each split's
    statistics computed on the way (components/ingest_statistics.py)."""

    SUMMARIZES = True  # _examples' outputs hold each split's statistics summaries

    def GetInputSourceToExamplePTransform(self) -> beam.PTransform:
        raise NotImplementedError("reads record batches in GenerateExamplesByBeam")

    def _examples(self, pipeline, inputs: list[tuple], exec_properties: dict[str, Any]) -> list:
        """Each input split's framed records tagged by output split name; `inputs`: (label, file
        pattern, output split names, hash buckets) per input split (other formats override it)."""
        return _examples(pipeline, inputs, csv_options(exec_properties))

    def GenerateExamplesByBeam(self, pipeline, exec_properties: dict[str, Any]) -> dict[str, beam.PCollection]:
        """Framed-record PCollections by output split name."""
        return {name: tagged[name] for name, tagged in self._tagged(pipeline, exec_properties).items()}

    def _tagged(self, pipeline, exec_properties: dict[str, Any]) -> dict[str, Any]:
        """By output split name, the tagged outputs that hold its framed records (tagged by its
        name) and, where SUMMARIZES, its statistics summaries (by summary_tag(name))."""
        input_config = example_gen_pb2.Input()
        proto_utils.json_to_proto(exec_properties[standard_component_specs.INPUT_CONFIG_KEY], input_config)
        output_config = example_gen_pb2.Output()
        proto_utils.json_to_proto(exec_properties[standard_component_specs.OUTPUT_CONFIG_KEY], output_config)
        split_names = utils.generate_output_split_names(input_config, output_config)
        input_base = exec_properties[standard_component_specs.INPUT_BASE_KEY]
        if output_config.split_config.splits:
            if output_config.split_config.HasField("partition_feature_name"):
                raise ValueError("loopline's ExampleGens split by whole examples (no partition_feature_name)")
            buckets, total = [], 0
            for split in output_config.split_config.splits:
                total += split.hash_buckets
                buckets.append(total)
            pattern = os.path.join(input_base, input_config.splits[0].pattern)
            [tagged] = self._examples(pipeline, [("all", pattern, split_names, buckets)], exec_properties)
            return {name: tagged for name in split_names}
        inputs = [(name, os.path.join(input_base, split.pattern), [name], None) for name, split in zip(split_names, input_config.splits)]
        return dict(zip(split_names, self._examples(pipeline, inputs, exec_properties)))

    def Do(self, input_dict, output_dict, exec_properties) -> None:
        from validation.statistics import SummaryCombineFn

        self._log_startup(input_dict, output_dict, exec_properties)
        examples = artifact_utils.get_single_instance(output_dict[standard_component_specs.EXAMPLES_KEY])
        input_config = example_gen_pb2.Input()
        proto_utils.json_to_proto(exec_properties[standard_component_specs.INPUT_CONFIG_KEY], input_config)
        output_config = example_gen_pb2.Output()
        proto_utils.json_to_proto(exec_properties[standard_component_specs.OUTPUT_CONFIG_KEY], output_config)
        examples.split_names = artifact_utils.encode_split_names(utils.generate_output_split_names(input_config, output_config))
        with self._make_beam_pipeline() as pipeline:
            for name, tagged in self._tagged(pipeline, exec_properties).items():
                prefix = os.path.join(artifact_utils.get_split_uri([examples], name), DEFAULT_TF_RECORD_FILE_NAME)
                sink = _FramedRecordsSink(prefix, splits.columns_dir(examples.uri, name))
                tagged[name] | f"Write[{name}]" >> beam.io.Write(sink)
                if self.SUMMARIZES:
                    (tagged[summary_tag(name)]
                     | f"Statistics[{name}]" >> beam.CombineGlobally(SummaryCombineFn(name))
                     | f"WriteStatistics[{name}]" >> beam.Map(ingest_statistics.write_split_statistics, examples.uri, name))
        if self.SUMMARIZES:
            ingest_statistics.record_files(examples)
        payload_format = exec_properties.get(standard_component_specs.OUTPUT_DATA_FORMAT_KEY)
        if payload_format:
            from tfx.components.util import examples_utils

            examples_utils.set_payload_format(examples, payload_format)


class ArrowCsvExampleGen(example_gen_component.FileBasedExampleGen):
    """CsvExampleGen's component spec and driver with the Arrow executor."""

    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(Executor)
