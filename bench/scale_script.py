"""The bare training script the scale bench compares `loopline run` with: pandas -> Keras `fit`
with a validation split (the share loopline holds out of its train split,
trainer.validation_fraction's default) -> `model.export`, the default penguins model's size
(64-32, a species head and a body-mass head), the encoding inside the model (Normalization,
StringLookup), one epoch. `python -m bench.scale_script DATA.csv EXPORT_DIR BATCH EPOCHS`.

`fit` gets tf.data datasets built from the frame, not the arrays themselves, and the validation
rows are cut off by hand, as `fit(validation_split=...)` cuts them: the last share of the rows as
given (here after pandas' shuffle), before fit's own shuffling; the training rows are then
gathered per batch in a new random order each epoch, as fit does with arrays. Why not the arrays:
Keras 3 passes them whole as one tf.data element per batch (`from_tensors(arrays).repeat()`, then
a gather), and tf.data's per-element memory accounting (`Tensor::AllocatedBytes`) walks every
string of a string tensor: each batch costs time in proportion to all the rows, so a run grows
with the square of the rows (on the scale bench's data: 35 CPU seconds at 1M rows, 89 at 2M,
still running after 14 CPU minutes at 10M; the symptom is reported upstream as
keras-team/keras#14915). Here the map function captures the tensors instead of receiving them, and
a batch costs the same at any size (16 CPU seconds at 1M rows, 26 at 2M, 38 at 4M, 92 at 10M)."""
from __future__ import annotations

import sys

VALIDATION_FRACTION = 0.2  # trainer.validation_fraction's default


def model_body(keras, x, species: int):
    """The penguins model's layers after the encoding: 64-32 and its two heads."""
    x = keras.layers.Dense(64, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-4))(x)
    x = keras.layers.Dense(32, activation="relu")(x)
    return {"species": keras.layers.Dense(species, activation="softmax", name="species")(x),
            "body_mass_g": keras.layers.Dense(1, name="body_mass_g")(x)}


def compile_model(keras, model) -> None:
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss={"species": "sparse_categorical_crossentropy", "body_mass_g": "mse"},
                  loss_weights={"species": 1.0, "body_mass_g": 0.5})


def batches(tf, columns, batch_size: int, shuffle: bool):
    """`columns` (a structure of tensors, one row per index) in batches of rows gathered from the
    tensors the map function captures; a new random order each epoch when `shuffle`."""
    rows = int(tf.nest.flatten(columns)[0].shape[0])
    order = tf.data.Dataset.range(rows)
    if shuffle:  # one permutation per epoch, from a seed drawn anew for each iterator (also under a global seed)
        order = tf.data.Dataset.random(rerandomize_each_iteration=True).take(1).map(
            lambda seed: tf.random.experimental.stateless_shuffle(tf.range(rows, dtype=tf.int64), [seed, 0])).unbatch()

    def gather(index):
        return tf.nest.map_structure(lambda column: tf.gather(column, index), columns)

    return order.batch(batch_size).map(gather, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def encoded_inputs(keras, tf, frame, labels: list[str]) -> tuple[dict, list, dict]:
    """The frame's other columns as the model's inputs, their encodings inside the model (numbers
    normalized, a missing one filled with its column's mean; text one-hot over the values seen)
    and the columns as tensors keyed like the inputs. Fills the frame's missing cells in place."""
    import numpy as np

    numbers = [c for c in frame.columns if c not in labels and frame[c].dtype.kind in "if"]
    strings = [c for c in frame.columns if c not in labels and c not in numbers]
    inputs, encoded = {}, []
    for name in numbers:
        values = frame[name].astype("float32")
        frame[name] = values.fillna(values.mean())
        inputs[name] = keras.Input((1,), name=name)
        norm = keras.layers.Normalization()
        norm.adapt(frame[name].to_numpy()[:, None])
        encoded.append(norm(inputs[name]))
    for name in strings:
        frame[name] = frame[name].fillna("").astype(str)
        inputs[name] = keras.Input((1,), dtype="string", name=name)
        lookup = keras.layers.StringLookup(vocabulary=sorted(set(frame[name]) - {""}), output_mode="one_hot")
        encoded.append(lookup(inputs[name]))
    features = {n: tf.constant(frame[n].to_numpy(np.float32)[:, None]) for n in numbers}
    features.update({n: tf.constant(frame[n].to_numpy()[:, None]) for n in strings})  # object arrays -> tf.string
    return inputs, encoded, features


def fit_and_export(tf, model, features, targets, batch_size: int, epochs: int, export_dir: str) -> None:
    """`fit` with the validation rows cut off where fit(validation_split=...) cuts them, then `export`."""
    split = int(len(next(iter(features.values()))) * (1.0 - VALIDATION_FRACTION))
    train = tf.nest.map_structure(lambda column: column[:split], (features, targets))
    validation = tf.nest.map_structure(lambda column: column[split:], (features, targets))
    model.fit(batches(tf, train, batch_size, shuffle=True), epochs=epochs, verbose=0, shuffle=False,  # batches shuffles
              validation_data=batches(tf, validation, batch_size, shuffle=False))
    model.export(export_dir, verbose=False)


def main(data: str, export_dir: str, batch_size: int, epochs: int) -> None:
    import keras
    import numpy as np
    import pandas as pd
    import tensorflow as tf

    frame = pd.read_csv(data).dropna(subset=["species", "body_mass_g"]).sample(frac=1.0, random_state=0)
    inputs, encoded, features = encoded_inputs(keras, tf, frame, ["species", "body_mass_g"])
    species = sorted(frame["species"].unique())
    model = keras.Model(inputs, model_body(keras, keras.layers.Concatenate()(encoded), len(species)))
    compile_model(keras, model)
    mass_mean, mass_std = frame["body_mass_g"].mean(), frame["body_mass_g"].std()
    targets = {"species": tf.constant(frame["species"].map({s: i for i, s in enumerate(species)}).to_numpy()),
               "body_mass_g": tf.constant(((frame["body_mass_g"] - mass_mean) / mass_std).to_numpy(np.float32))}
    fit_and_export(tf, model, features, targets, batch_size, epochs, export_dir)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
