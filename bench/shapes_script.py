"""The bare training script the shapes bench compares `loopline run` with, on any table of number
and text columns with one classification label `label`: pandas -> Keras `fit` with a validation
split (trainer.validation_fraction's default) -> `model.export`. The model is loopline's generic
one (trainer.model.build_tabular_model): the numbers standardized, the text columns one-hot, two
ReLU layers of 64 with L2, a softmax head. The encoding runs inside the model (Normalization,
StringLookup) and the input and fit are bench.scale_script's; it trains one epoch.
`python -m bench.shapes_script DATA.csv EXPORT_DIR BATCH EPOCHS`."""
from __future__ import annotations

import sys

from bench.scale_script import encoded_inputs, fit_and_export

LABEL = "label"
HIDDEN_UNITS, L2 = (64, 64), 1e-3  # trainer.model's HIDDEN_UNITS and L2 (not imported: the script stands alone)


def main(data: str, export_dir: str, batch_size: int, epochs: int) -> None:
    import keras
    import pandas as pd
    import tensorflow as tf

    frame = pd.read_csv(data).dropna(subset=[LABEL]).sample(frac=1.0, random_state=0)
    frame[LABEL] = frame[LABEL].astype(str)
    inputs, encoded, features = encoded_inputs(keras, tf, frame, [LABEL])
    classes = sorted(frame[LABEL].unique())
    x = keras.layers.Concatenate()(encoded)
    for units in HIDDEN_UNITS:
        x = keras.layers.Dense(units, activation="relu", kernel_regularizer=keras.regularizers.L2(L2))(x)
    model = keras.Model(inputs, keras.layers.Dense(len(classes), activation="softmax", name=LABEL)(x))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
    targets = tf.constant(frame[LABEL].map({c: i for i, c in enumerate(classes)}).to_numpy())
    fit_and_export(tf, model, features, targets, batch_size, epochs, export_dir)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
