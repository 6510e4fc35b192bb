"""The tensorflow-metadata Schema: inferred from a split's statistics, or a curated file.

Stored as text (`schema.pbtxt`), the layout of TFX's SchemaGen and ImportSchemaGen, so a schema
written here can be edited by hand and checked in as `data.schema`.
"""
from __future__ import annotations

import os

import tensorflow as tf
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2, statistics_pb2

from validation.config import ValidationConfig
from validation.statistics import common_stats, is_image_feature, value_counts

SCHEMA_FILE = "schema.pbtxt"  # tfx.components.schema_gen.executor.DEFAULT_FILE_NAME

SCHEMA_TYPES = {  # statistics type -> schema type
    statistics_pb2.FeatureNameStatistics.INT: schema_pb2.INT,
    statistics_pb2.FeatureNameStatistics.FLOAT: schema_pb2.FLOAT,
    statistics_pb2.FeatureNameStatistics.STRING: schema_pb2.BYTES,
    statistics_pb2.FeatureNameStatistics.BYTES: schema_pb2.BYTES,
}


def is_number_text(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def numeric_fraction(feature: statistics_pb2.FeatureNameStatistics) -> float:
    """The fraction of a string feature's values that parse as numbers."""
    counts = value_counts(feature)
    total = sum(counts.values())
    return sum(c for v, c in counts.items() if is_number_text(v)) / total if total else 0.0


def infer_schema(stats: statistics_pb2.DatasetFeatureStatistics, config: ValidationConfig) -> schema_pb2.Schema:
    """Types, presence, shape and string domains from one split's statistics (usually train)."""
    schema = schema_pb2.Schema()
    for feature_stats in stats.features:
        feature = schema.feature.add(name=feature_stats.name, type=SCHEMA_TYPES[feature_stats.type])
        common = common_stats(feature_stats)
        floor = round(1.0 - config.max_missing_fraction, 6)
        # A schema inferred from a split must accept that split: a column already sparse in
        # training (a CSV's mostly empty `cabin`) gets no fraction floor, as TFDV infers presence
        # for a feature not always present; its disappearance is still caught by min_count.
        if stats.num_examples and common.num_non_missing / stats.num_examples >= floor:
            feature.presence.min_fraction = floor
        feature.presence.min_count = 1
        if common.max_num_values <= 1:
            feature.value_count.min = 1
            feature.value_count.max = 1
        elif common.min_num_values == common.max_num_values and not common.num_missing:
            feature.shape.dim.add(size=common.max_num_values)  # TFDV: the same count in every example
            # ...and, as TFDV infers it, present in every example: tfx_bsl (Transform's and
            # TFX's input readers) refuses a shape beside a presence below 1.
            feature.presence.min_fraction = 1.0
        else:
            feature.value_count.min = common.min_num_values
            feature.value_count.max = common.max_num_values
        if is_image_feature(feature_stats):
            feature.image_domain.SetInParent()  # no string domain, no drift on blobs
            continue
        if feature.type == schema_pb2.BYTES:
            unique = feature_stats.string_stats.unique
            # A mostly numeric string column is a broken numeric column, not a category set:
            # the validator reports it; a domain of its numbers would only add noise.
            if 0 < unique <= config.max_domain_size and numeric_fraction(feature_stats) < config.numeric_text_fraction:
                schema.string_domain.add(name=feature.name, value=sorted(value_counts(feature_stats)))
                feature.domain = feature.name
                feature.distribution_constraints.min_domain_mass = config.min_domain_mass
            feature.skew_comparator.infinity_norm.threshold = config.max_linf_distance
        else:
            feature.skew_comparator.jensen_shannon_divergence.threshold = config.max_js_divergence
            if feature.type == schema_pb2.FLOAT:
                feature.float_domain.disallow_inf = True  # an inf is a broken value upstream; allow it here if not
            if config.infer_ranges and feature_stats.num_stats.common_stats.num_non_missing:
                low, high = feature_stats.num_stats.min, feature_stats.num_stats.max
                if feature.type == schema_pb2.INT:
                    feature.int_domain.min, feature.int_domain.max = int(low), int(high)
                else:
                    feature.float_domain.min, feature.float_domain.max = low, high
    return schema


def write_schema(directory: str, schema: schema_pb2.Schema) -> str:
    tf.io.gfile.makedirs(directory)
    path = os.path.join(directory, SCHEMA_FILE)
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(text_format.MessageToString(schema))
    return path


def load_schema(path: str) -> schema_pb2.Schema:
    """Reads a text-format Schema file (a directory means its `schema.pbtxt`); errors name the file."""
    if tf.io.gfile.isdir(path):
        path = os.path.join(path, SCHEMA_FILE)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"schema file not found: {path}")
    with tf.io.gfile.GFile(path, "r") as f:
        text = f.read()
    try:
        return text_format.Parse(text, schema_pb2.Schema())
    except text_format.ParseError as exc:
        raise ValueError(f"{path}: not a valid tensorflow-metadata Schema in text format: {exc}") from None


def string_domain(schema: schema_pb2.Schema, feature: schema_pb2.Feature) -> list[str] | None:
    """The allowed values of a string feature, or None when it has no domain."""
    if feature.HasField("string_domain"):
        return list(feature.string_domain.value)
    if feature.HasField("domain"):
        for domain in schema.string_domain:
            if domain.name == feature.domain:
                return list(domain.value)
        raise ValueError(f"schema: feature '{feature.name}' names domain '{feature.domain}', which is not defined")
    return None


def _describe_feature(schema: schema_pb2.Schema, feature: schema_pb2.Feature) -> dict[str, str]:
    """The parts of a feature a reader compares between two schemas, in words."""
    parts = {"type": schema_pb2.FeatureType.Name(feature.type)}
    if feature.HasField("presence"):
        parts["presence"] = f"min_fraction {feature.presence.min_fraction:g}"
    domain = string_domain(schema, feature)
    if domain is not None:
        parts["domain"] = ", ".join(repr(v) for v in sorted(domain))
    for kind in ("int_domain", "float_domain"):
        bounds = getattr(feature, kind)
        if feature.HasField(kind) and (bounds.HasField("min") or bounds.HasField("max")):
            low = f"{bounds.min:g}" if bounds.HasField("min") else "-inf"
            high = f"{bounds.max:g}" if bounds.HasField("max") else "inf"
            parts["range"] = f"[{low}, {high}]"
    return parts


def schema_changes(old: schema_pb2.Schema, new: schema_pb2.Schema) -> list[str]:
    """What changed from `old` to `new`, one line per feature: removed, added, or a part changed."""
    before = {f.name: _describe_feature(old, f) for f in old.feature}
    after = {f.name: _describe_feature(new, f) for f in new.feature}
    lines = [f"- {name} ({before[name]['type']}): no longer in the data" for name in sorted(set(before) - set(after))]
    lines += [f"+ {name} ({after[name]['type']}): new" for name in sorted(set(after) - set(before))]
    for name in sorted(set(before) & set(after)):
        for part in sorted(set(before[name]) | set(after[name])):
            was, now = before[name].get(part, "(none)"), after[name].get(part, "(none)")
            if was != now:
                lines.append(f"~ {name}: {part} {was} -> {now}")
    return lines


def schema_text_diff(old: schema_pb2.Schema, new: schema_pb2.Schema, old_name: str, new_name: str) -> str:
    """A unified diff of the two schemas in text format (to apply to a curated file by hand)."""
    import difflib

    return "".join(difflib.unified_diff(
        text_format.MessageToString(old).splitlines(keepends=True),
        text_format.MessageToString(new).splitlines(keepends=True),
        fromfile=old_name, tofile=new_name,
    ))
