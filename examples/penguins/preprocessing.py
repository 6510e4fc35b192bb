"""A tf.Transform `preprocessing_fn` for the bundled penguins data, for loopline's own model:
`--set transform.module_file=examples/penguins/preprocessing.py`. The model trains on its outputs;
the exported signatures take the raw columns and run this graph first, so serving cannot skew.

The labels (the default model's `species` and `body_mass_g`) pass through unchanged under their own
names: the Evaluator reads them from the raw examples. `body_mass_g_z`, computed from a label, is
no input of a model that predicts body mass (loopline leaves such outputs out)."""
import tensorflow as tf
import tensorflow_transform as tft

NUMBERS = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]
WORDS = ["island", "sex"]
LABELS = ["species", "body_mass_g"]


def _dense(x, default):
    """A feature that may be missing in some rows (a sparse tensor) as a `[batch]` tensor."""
    if isinstance(x, tf.sparse.SparseTensor):
        x = tf.sparse.to_dense(tf.SparseTensor(x.indices, x.values, [x.dense_shape[0], 1]), default)
    return tf.reshape(x, [-1])


def preprocessing_fn(inputs):
    outputs = {}
    for name in NUMBERS:
        value = tf.cast(inputs[name], tf.float32)
        # A missing measurement is the train split's mean, then every value a z-score.
        outputs[f"{name}_z"] = tft.scale_to_z_score(_dense(value, tft.mean(value)))
    for name in WORDS:
        outputs[f"{name}_id"] = tft.compute_and_apply_vocabulary(_dense(inputs[name], ""), num_oov_buckets=1)
    for name in LABELS:
        outputs[name] = inputs[name]
    return outputs
