"""A Transform step's graph in front of loopline's own model (TFX's `fn_args.transform_output`).

The model trains on the Transform's transformed examples, as a run_fn does; its exported
signatures take the raw features (serialized tf.Examples, or one tensor per feature for
`predict_raw`), exactly as without a Transform, run the transform graph, then the model. The graph
analyzed over the train split is the one served: training and serving cannot skew.

Two rules keep the Evaluator honest. A label passes through the preprocessing_fn unchanged under
its own name (the Evaluator, the trivial floor and the champion read it from the raw examples);
and an output computed from a label is no input of the model (it would hand it the answer): the
model's inputs are the outputs the graph still computes when no label is given.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from serving.signature_names import signature_name
from trainer.features import FeatureKinds, feature_shape, is_number, kinds_from_schema


class TransformError(ValueError):
    """The preprocessing_fn's outputs cannot feed loopline's model; says which output and why."""


class InputTransform:
    """Raw features, as loopline parses them (`features.parse_examples`: dense tensors by signature
    name, a missing number NaN, a missing string empty), to the model's transformed inputs."""

    def __init__(self, transform_dir: str, raw_kinds: FeatureKinds, labels: list[str], examples: list[bytes]):
        """`transform_dir`: the TransformGraph artifact's folder; `raw_kinds`: the raw schema's;
        `labels`: the model's label columns; `examples`: raw serialized examples to find, and
        check, what the graph computes from what."""
        import tensorflow_transform as tft

        if not examples:
            raise TransformError("no raw examples to check the transform graph on")
        output = tft.TFTransformOutput(transform_dir)
        self.layer = output.transform_features_layer()  # the export tracks it: its tables and vocabularies
        raw_spec = output.raw_feature_spec()
        transformed_kinds = kinds_from_schema(output.transformed_metadata.schema)
        serialized = tf.constant(examples)
        _check_labels_pass_through(self.layer, raw_spec, labels, serialized)
        features = {c: s for c, s in raw_spec.items() if c in raw_kinds and c not in labels}
        outputs = self._outputs(features, serialized)
        self.input_kinds = {c: k for c, k in sorted(transformed_kinds.items()) if c in outputs and c not in labels}
        if not self.input_kinds:
            raise TransformError("the preprocessing_fn computes every output from a label: the model has no inputs")
        # The raw features the model needs: those whose absence loses one of its inputs.
        self.raw_spec = {c: s for c, s in features.items()
                         if set(self.input_kinds) - self._outputs({k: v for k, v in features.items() if k != c}, serialized)}
        self.raw_kinds = {c: raw_kinds[c] for c in sorted(self.raw_spec)}
        self.kinds = {**self.input_kinds, **{label: transformed_kinds[label] for label in labels}}
        # Vocabulary indices, buckets and hashes: the transformed schema marks them categorical.
        self.categorical = sorted(f.name for f in output.transformed_metadata.schema.feature
                                  if f.name in self.input_kinds and f.int_domain.is_categorical)

    def _outputs(self, spec: dict, serialized: tf.Tensor) -> set[str]:
        """The graph's outputs given only the features of `spec`."""
        return set(self.layer(tf.io.parse_example(serialized, spec)))

    def __call__(self, features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        raw = {column: _as_raw(features[signature_name(column)], spec) for column, spec in self.raw_spec.items()}
        out = self.layer(raw)
        return {signature_name(column): _as_kind(out[column], kind) for column, kind in self.input_kinds.items()}


def _check_labels_pass_through(layer, raw_spec: dict, labels: list[str], serialized: tf.Tensor) -> None:
    out = layer(tf.io.parse_example(serialized, raw_spec))
    raw = tf.io.parse_example(serialized, {label: raw_spec[label] for label in labels if label in raw_spec})
    for label in labels:
        if label not in out or label not in raw:
            raise TransformError(f"the preprocessing_fn has no output '{label}': loopline's model trains on the "
                                 f"transformed examples and reads its label '{label}' there; pass it through "
                                 f"unchanged (outputs['{label}'] = inputs['{label}'])")
        if not np.array_equal(_values(out[label]), _values(raw[label])):
            raise TransformError(f"the preprocessing_fn's output '{label}' is not its input '{label}': the Evaluator "
                                 "reads the label from the raw examples, so it must pass through unchanged (a "
                                 "transformed label belongs in an output of another name)")


def _values(tensor) -> np.ndarray:
    values = tensor.values if isinstance(tensor, tf.SparseTensor) else tf.reshape(tensor, [-1])
    return values.numpy()


def _as_raw(dense: tf.Tensor, spec) -> tf.Tensor | tf.SparseTensor:
    """A parsed `[batch, size]` column as the graph's raw input: a fixed-length feature cast and
    shaped, a variable-length one sparse with the missing values (NaN, empty) left out."""
    if isinstance(spec, tf.io.FixedLenFeature):
        return tf.reshape(tf.cast(dense, spec.dtype), [-1, *spec.shape])
    present = tf.strings.length(dense) > 0 if dense.dtype == tf.string else tf.logical_not(tf.math.is_nan(dense))
    indices = tf.where(present)
    return tf.SparseTensor(indices, tf.cast(tf.gather_nd(dense, indices), spec.dtype),
                           tf.shape(dense, out_type=tf.int64))


def _as_kind(tensor, kind: str) -> tf.Tensor:
    """A graph output as loopline parses that column from the transformed examples: numbers as
    float32, a missing value NaN (a number) or empty (a string)."""
    shape = feature_shape(kind)
    if isinstance(tensor, tf.SparseTensor):
        values = tf.cast(tensor.values, tf.float32) if is_number(kind) else tensor.values
        size = int(np.prod(shape))
        tensor = tf.sparse.to_dense(tf.SparseTensor(tensor.indices, values, [tensor.dense_shape[0], size]),
                                    default_value=np.nan if is_number(kind) else "")
    elif is_number(kind):
        tensor = tf.cast(tensor, tf.float32)
    return tf.reshape(tensor, [-1, *shape])
