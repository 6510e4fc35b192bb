"""A TFX module file for the scale bench's penguins data (bench.transform): a `preprocessing_fn`
as a TFX user writes one (z-scores, vocabularies, the label as an index) and a `run_fn` that
trains a small Keras model on the transformed examples for `fn_args.train_steps` steps and saves
it with the transform graph in its serving signature (raw tf.Examples in)."""
import tensorflow as tf
import tensorflow_transform as tft
from tfx_bsl.public import tfxio

NUMBERS = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]
WORDS = ["island", "sex"]
LABEL = "species_id"  # bench.transform adds it: the species as 0, 1, 2


def _dense(x, default):
    """A feature that may be missing (a sparse tensor) as a `[batch]` tensor."""
    if isinstance(x, tf.sparse.SparseTensor):
        x = tf.sparse.to_dense(tf.SparseTensor(x.indices, x.values, [x.dense_shape[0], 1]), default)
    return tf.reshape(x, [-1])


def preprocessing_fn(inputs):
    outputs = {f"{k}_xf": tft.scale_to_z_score(_dense(tf.cast(inputs[k], tf.float32), 0.0)) for k in NUMBERS}
    for key in WORDS:
        outputs[f"{key}_xf"] = tft.compute_and_apply_vocabulary(_dense(inputs[key], ""), num_oov_buckets=1)
    outputs[f"{LABEL}_xf"] = _dense(inputs[LABEL], 0)
    return outputs


def run_fn(fn_args):
    transform = tft.TFTransformOutput(fn_args.transform_output)
    dataset = fn_args.data_accessor.tf_dataset_factory(
        fn_args.train_files, tfxio.TensorFlowDatasetOptions(batch_size=256, label_key=f"{LABEL}_xf"),
        transform.transformed_metadata.schema).repeat()
    inputs = {f"{k}_xf": tf.keras.Input([1], name=f"{k}_xf") for k in NUMBERS + WORDS}
    hidden = tf.keras.layers.Dense(32, activation="relu")(tf.keras.layers.concatenate(
        [tf.cast(v, tf.float32) for v in inputs.values()]))
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(3)(hidden))
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(dataset, steps_per_epoch=fn_args.train_steps, epochs=1, verbose=0)
    model.tft_layer = transform.transform_features_layer()

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve(serialized):
        spec = transform.raw_feature_spec()
        spec.pop(LABEL)
        spec.pop("species")  # the label in words, not an input either
        features = model.tft_layer(tf.io.parse_example(serialized, spec))
        return {"outputs": model({k: features[k] for k in inputs})}

    tf.saved_model.save(model, fn_args.serving_model_dir, signatures={"serving_default": serve})
