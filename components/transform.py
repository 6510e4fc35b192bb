"""Transform: a module file's `preprocessing_fn` (tf.Transform) analyzed over the train split and
applied to every split, as TFX's Transform does. TFX's own component needs TensorFlow Data
Validation, which does not install here, so this one calls tensorflow_transform's Beam API itself
and writes TFX's artifacts: the `transform_graph` (TransformGraph: `transform_fn/` and
`transformed_metadata/`, what `tft.TFTransformOutput` reads) and the `transformed_examples`
(Examples: `Split-<name>/transformed_examples-*.gz`, GZIP tf.Example TFRecords)."""

import logging
import os

import apache_beam as beam
from tfx.dsl.component.experimental.annotations import (BeamComponentParameter, InputArtifact, OutputArtifact,
                                                         Parameter)
from tfx.dsl.component.experimental.decorators import component
from tfx.types import artifact_utils
from tfx.types.standard_artifacts import Examples, ExampleStatistics, Schema, TransformGraph

from components.splits import TRAIN_SPLIT, split_pattern

EXAMPLES_PREFIX = "transformed_examples"  # TFX Transform's file prefix in each split folder


def dense_where_always_one(schema, stats):
    """A copy of `schema` where a feature with exactly one value in every example of `stats` (the
    train split's) has the fixed shape [1], as TFX's SchemaGen infers shapes (TFDV's
    infer_feature_shape): tf.Transform then hands it to the preprocessing_fn as a dense tensor."""
    from validation.statistics import common_stats

    always_one = {f.name or f.path.step[0] for f in stats.features
                  if common_stats(f).num_missing == 0 and common_stats(f).min_num_values == 1
                  and common_stats(f).max_num_values == 1}
    shaped = type(schema)()
    shaped.CopyFrom(schema)
    for feature in shaped.feature:
        if feature.name in always_one and not feature.HasField("shape"):
            feature.ClearField("value_count")
            feature.shape.dim.add(size=1)
            feature.presence.min_fraction = 1.0  # tfx-bsl reads a shape only on an always present feature
    return shaped


@component(use_beam=True)
def Transform(
    examples: InputArtifact[Examples],
    schema: InputArtifact[Schema],
    statistics: InputArtifact[ExampleStatistics],
    transform_graph: OutputArtifact[TransformGraph],
    transformed_examples: OutputArtifact[Examples],
    module_file: Parameter[str],
    module_sha256: Parameter[str] = "",
    beam_pipeline: BeamComponentParameter[beam.Pipeline] = None,
) -> None:
    """`module_file` holds `preprocessing_fn(inputs) -> outputs`; `module_sha256` makes the cache
    see edits to it."""
    del module_sha256  # Only there for the cache key.
    import tensorflow as tf
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam
    from tensorflow_transform.tf_metadata import dataset_metadata, metadata_io
    from tfx.components.util import examples_utils
    from tfx.proto import example_gen_pb2
    from tfx_bsl.public import tfxio

    from components.tfx_module_file import module_function, tfx_keras
    from validation.schema import load_schema
    from validation.statistics import read_statistics

    preprocessing_fn = module_function(module_file, "preprocessing_fn")
    train_stats = read_statistics(artifact_utils.get_split_uri([statistics], TRAIN_SPLIT))
    raw_schema = dense_where_always_one(load_schema(schema.uri), train_stats)
    splits = artifact_utils.decode_split_names(examples.split_names)
    transformed_examples.split_names = artifact_utils.encode_split_names(splits)
    examples_utils.set_payload_format(transformed_examples, example_gen_pb2.FORMAT_TF_EXAMPLE)  # what readers check

    def read(pipeline, split):
        source = tfxio.TFExampleRecord(split_pattern(examples, split), schema=raw_schema,
                                       telemetry_descriptors=["loopline", "Transform"])
        return pipeline | f"Read[{split}]" >> source.BeamSource(), source.TensorAdapterConfig()

    temp_dir = os.path.join(transform_graph.uri, "tmp")  # tf.Transform's working files, removed at the end
    with tfx_keras(), beam_pipeline as pipeline, tft_beam.Context(temp_dir=temp_dir):  # preprocessing_fn runs here
        raw = {split: read(pipeline, split) for split in splits}
        transform_fn = raw[TRAIN_SPLIT] | "Analyze" >> tft_beam.AnalyzeDataset(preprocessing_fn)
        _ = transform_fn | "WriteTransformFn" >> tft_beam.WriteTransformFn(transform_graph.uri)
        for split in splits:
            _write_split(raw[split], transform_fn, split,
                         artifact_utils.get_split_uri([transformed_examples], split))
    tf.io.gfile.rmtree(temp_dir)
    # The raw data's metadata too (TFX's Transform writes it): `raw_feature_spec()` reads it.
    metadata_io.write_metadata(dataset_metadata.DatasetMetadata(raw_schema),
                               os.path.join(transform_graph.uri, tft.TFTransformOutput.RAW_METADATA_DIR))
    logging.getLogger("loopline").info("transform: %s applied to %s", os.path.basename(module_file), ", ".join(splits))


def _write_split(raw_dataset, transform_fn, split: str, split_dir: str) -> None:
    """One split through the transform function, written as tf.Examples of the transformed schema."""
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam

    data, metadata = (raw_dataset, transform_fn) | f"Transform[{split}]" >> tft_beam.TransformDataset()
    coder = tft.coders.ExampleProtoCoder(metadata.schema)
    _ = (data
         | f"Encode[{split}]" >> beam.Map(coder.encode)
         | f"Write[{split}]" >> beam.io.WriteToTFRecord(os.path.join(split_dir, EXAMPLES_PREFIX),
                                                        file_name_suffix=".gz"))


def training_inputs(examples, schema, transform_graph, transformed_examples, config, label: str):
    """What loopline's own model trains on, for the Trainer and loopline's search alike: (the
    examples, their feature kinds, the transform graph in front of the model or None, the trainer
    config to train with). With a Transform step: its examples and features, the graph checked on
    the first 1,000 raw train examples (trainer.transform_graph), and its categorical outputs added
    to `trainer.categorical_features`. Without: ExampleGen's, their kinds from the schema (None
    without a schema: inferred from the data)."""
    from trainer.features import kinds_from_schema
    from validation.schema import load_schema

    if transform_graph is None:
        return examples, None if schema is None else kinds_from_schema(load_schema(schema.uri)), None, config
    from trainer.evaluation import read_examples
    from trainer.model import label_names, load_module
    from trainer.transform_graph import InputTransform

    transform = InputTransform(transform_graph.uri, kinds_from_schema(load_schema(schema.uri)),
                               label_names(load_module(config.module_file), label),
                               read_examples(split_pattern(examples, TRAIN_SPLIT), 1000))
    categorical = sorted({*config.categorical_features, *transform.categorical})
    return transformed_examples, transform.kinds, transform, config.model_copy(update={"categorical_features": categorical})
