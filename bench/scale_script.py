"""The bare training script the scale bench compares `loopline run` with: pandas -> tf.data ->
Keras `fit` -> `model.export`, the default penguins model's size (64-32, a species head and a
body-mass head), one epoch. `python -m bench.scale_script DATA.csv EXPORT_DIR BATCH EPOCHS`."""
from __future__ import annotations

import sys


def main(data: str, export_dir: str, batch_size: int, epochs: int) -> None:
    import keras
    import numpy as np
    import pandas as pd
    import tensorflow as tf

    frame = pd.read_csv(data).dropna(subset=["species", "body_mass_g"])
    labels = ["species", "body_mass_g"]
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
    x = keras.layers.Concatenate()(encoded)
    x = keras.layers.Dense(64, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-4))(x)
    x = keras.layers.Dense(32, activation="relu")(x)
    species = sorted(frame["species"].unique())
    mass_mean, mass_std = frame["body_mass_g"].mean(), frame["body_mass_g"].std()
    outputs = {"species": keras.layers.Dense(len(species), activation="softmax", name="species")(x),
               "body_mass_g": keras.layers.Dense(1, name="body_mass_g")(x)}
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss={"species": "sparse_categorical_crossentropy", "body_mass_g": "mse"},
                  loss_weights={"species": 1.0, "body_mass_g": 0.5})
    features = {n: frame[n].to_numpy()[:, None] for n in numbers + strings}
    targets = {"species": frame["species"].map({s: i for i, s in enumerate(species)}).to_numpy(),
               "body_mass_g": ((frame["body_mass_g"] - mass_mean) / mass_std).to_numpy(np.float32)}
    dataset = tf.data.Dataset.from_tensor_slices((features, targets)).shuffle(10_000, seed=0).batch(batch_size).prefetch(2)
    model.fit(dataset, epochs=epochs, verbose=0)
    model.export(export_dir, verbose=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
