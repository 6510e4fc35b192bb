"""The lean script a user might write instead of `loopline run`: pandas does the encoding
outside the model (numbers standardized, missing values filled with the mean; strings one-hot
encoded with `get_dummies`), then Keras `fit` on one float matrix with the same validation split
as bench/scale_script.py, then `model.export`. Same layers and heads as the penguins model.
`python -m bench.scale_lean_script DATA.csv EXPORT_DIR BATCH EPOCHS`."""
from __future__ import annotations

import sys

from bench.scale_script import VALIDATION_FRACTION, compile_model, model_body


def main(data: str, export_dir: str, batch_size: int, epochs: int) -> None:
    import keras
    import numpy as np
    import pandas as pd

    frame = pd.read_csv(data).dropna(subset=["species", "body_mass_g"]).sample(frac=1.0, random_state=0)
    labels = frame[["species", "body_mass_g"]]
    features = frame.drop(columns=labels.columns)
    numbers = features.select_dtypes("number").astype("float32")
    numbers = ((numbers - numbers.mean()) / numbers.std()).fillna(0.0)  # 0: the mean once standardized
    matrix = pd.concat([numbers, pd.get_dummies(features.select_dtypes(exclude="number"))], axis=1).to_numpy(np.float32)
    species = labels["species"].astype("category")
    mass = labels["body_mass_g"]
    inputs = keras.Input((matrix.shape[1],), name="features")
    model = keras.Model(inputs, model_body(keras, inputs, len(species.cat.categories)))
    compile_model(keras, model)
    targets = {"species": species.cat.codes.to_numpy(), "body_mass_g": ((mass - mass.mean()) / mass.std()).to_numpy(np.float32)}
    model.fit(matrix, targets, batch_size=batch_size, epochs=epochs, validation_split=VALIDATION_FRACTION, verbose=0)
    model.export(export_dir, verbose=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
