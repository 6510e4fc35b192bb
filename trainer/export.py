"""SavedModel export with TF Serving's signature conventions.

- `serving_default`: input `inputs` (serialized tf.Examples). The first head gives the outputs
  TF Serving's Classify/Regress APIs expect: `classes` + `scores` (classification) or
  `outputs` (regression); further heads come as `<head>_classes`/`<head>_scores` or `<head>`.
- `predict_raw`: one `[batch, 1]` tensor per feature (float32 numbers, strings), JSON friendly.
"""
from __future__ import annotations

import json
from pathlib import Path

import keras
import tensorflow as tf

from trainer.features import FeatureKinds, is_number, parse_examples
from trainer.heads import CLASSIFICATION, Head

SIGNATURE_FILE = "loopline_signature.json"


def named_outputs(heads: list[Head], outputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    named = {}
    for i, head in enumerate(heads):
        prediction = outputs[head.name]
        if head.kind == CLASSIFICATION:
            batch = tf.shape(prediction)[0]
            classes = tf.tile(tf.constant(head.vocabulary)[tf.newaxis, :], [batch, 1])
            prefix = "" if i == 0 else f"{head.name}_"
            named[f"{prefix}classes"] = classes
            named[f"{prefix}scores"] = prediction
        else:
            named["outputs" if i == 0 else head.name] = prediction
    return named


def raw_input_spec(kinds: FeatureKinds) -> dict[str, tf.TensorSpec]:
    return {
        name: tf.TensorSpec([None, 1], tf.float32 if is_number(kind) else tf.string, name=name)
        for name, kind in kinds.items()
    }


def export_saved_model(model: keras.Model, kinds: FeatureKinds, heads: list[Head], export_dir: str) -> str:
    """Writes the SavedModel to `export_dir`; returns it."""
    # Labels may be present in served examples; parse only the inputs.
    def serve_examples(inputs):
        features = parse_examples(inputs, kinds)
        return named_outputs(heads, model(features, training=False))

    def serve_raw(features):
        return named_outputs(heads, model(features, training=False))

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", serve_examples, input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    archive.add_endpoint("predict_raw", serve_raw, input_signature=[raw_input_spec(kinds)])
    archive.write_out(export_dir, verbose=False)
    # Readers that must not load TensorFlow (the serving config writer, clients) use this.
    description = {"features": kinds, "heads": [h.to_json() for h in heads]}
    assets = Path(export_dir) / "assets.extra"
    assets.mkdir(parents=True, exist_ok=True)
    (assets / SIGNATURE_FILE).write_text(json.dumps(description, indent=2))
    return export_dir
