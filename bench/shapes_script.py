"""The bare training script the shapes bench compares `loopline run` with, on any table of number
and text columns with one classification label `label`: pandas -> Keras `fit` with a validation
split (trainer.validation_fraction's default) -> `model.export`. The model is loopline's generic
one (trainer.model.build_tabular_model): the numbers standardized, the text columns one-hot, two
ReLU layers of 64 with L2, a softmax head. The encoding runs inside the model (Normalization,
StringLookup), the batches come from bench.scale_script's `batches`, and it trains one epoch.
`python -m bench.shapes_script DATA.csv EXPORT_DIR BATCH EPOCHS`."""
from __future__ import annotations

import sys

from bench.scale_script import VALIDATION_FRACTION, batches

LABEL = "label"
HIDDEN_UNITS, L2 = (64, 64), 1e-3  # trainer.model's HIDDEN_UNITS and L2 (not imported: the script stands alone)


def main(data: str, export_dir: str, batch_size: int, epochs: int) -> None:
    import keras
    import numpy as np
    import pandas as pd
    import tensorflow as tf

    frame = pd.read_csv(data).dropna(subset=[LABEL]).sample(frac=1.0, random_state=0)
    frame[LABEL] = frame[LABEL].astype(str)
    numbers = [c for c in frame.columns if c != LABEL and frame[c].dtype.kind in "if"]
    strings = [c for c in frame.columns if c != LABEL and c not in numbers]
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
    classes = sorted(frame[LABEL].unique())
    x = keras.layers.Concatenate()(encoded)
    for units in HIDDEN_UNITS:
        x = keras.layers.Dense(units, activation="relu", kernel_regularizer=keras.regularizers.L2(L2))(x)
    model = keras.Model(inputs, keras.layers.Dense(len(classes), activation="softmax", name=LABEL)(x))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
    features = {n: tf.constant(frame[n].to_numpy(np.float32)[:, None]) for n in numbers}
    features.update({n: tf.constant(frame[n].to_numpy()[:, None]) for n in strings})  # object arrays -> tf.string
    targets = tf.constant(frame[LABEL].map({c: i for i, c in enumerate(classes)}).to_numpy())
    split = int(len(frame) * (1.0 - VALIDATION_FRACTION))  # where fit(validation_split=...) cuts
    train = tf.nest.map_structure(lambda column: column[:split], (features, targets))
    validation = tf.nest.map_structure(lambda column: column[split:], (features, targets))
    model.fit(batches(tf, train, batch_size, shuffle=True), epochs=epochs, verbose=0, shuffle=False,  # batches shuffles
              validation_data=batches(tf, validation, batch_size, shuffle=False))
    model.export(export_dir, verbose=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
