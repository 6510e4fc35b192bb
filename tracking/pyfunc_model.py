"""An MLflow pyfunc model over a loopline SavedModel ("models from code": MLflow copies this file
into the logged model, so loading it needs tensorflow, pandas and mlflow, not loopline).

Input: a DataFrame with one column per feature (missing columns or values are treated as missing,
as the SavedModel does). Output: a DataFrame with, per head, the prediction (`<head>`: the class
for classification, the value for regression) and for classification one `<head>_score_<class>`
column per class. It calls the SavedModel's `predict_raw` signature.
"""
import json
import os
import warnings

import mlflow.pyfunc
import numpy as np
import pandas as pd
from mlflow.models import set_model

# The input is a DataFrame validated against the logged signature; MLflow's type-hint inference
# would only repeat that, but warns on every load without it.
warnings.filterwarnings("ignore", message=".*Add type hints to the `predict` method")  # text starts with a colour code

# Copies of serving/signature_names.py (this file is loaded without loopline): keep them equal.
SIGNATURE_FILE = os.path.join("assets.extra", "loopline_signature.json")
PREDICT_RAW = "predict_raw"


class SavedModelPyfunc(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        import tensorflow as tf

        self._tf = tf
        path = context.artifacts["saved_model"]
        self._predict = tf.saved_model.load(path).signatures[PREDICT_RAW]
        with open(os.path.join(path, SIGNATURE_FILE)) as f:
            description = json.load(f)
        self._features = description["features"]
        # {column: signature input name}; exports before it used the column names themselves
        self._inputs = description.get("signature_names", {})
        self._heads = description["heads"]

    def predict(self, context, model_input, params=None):
        tf = self._tf
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        rows = len(frame)
        inputs = {}
        for name, kind in self._features.items():
            key = self._inputs.get(name, name)
            given = name if name in frame.columns else key  # the data's column name, or the signature's
            column = frame[given] if given in frame.columns else pd.Series([None] * rows, dtype=object)
            if kind == "string":
                values = np.array(["" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v) for v in column], dtype=object)
                inputs[key] = tf.constant(values.reshape(-1, 1), tf.string)
            else:
                values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float32)
                inputs[key] = tf.constant(values.reshape(-1, 1), tf.float32)
        outputs = {k: v.numpy() for k, v in self._predict(**inputs).items()}
        result = {}
        for i, head in enumerate(self._heads):
            prefix = "" if i == 0 else f"{head['name']}_"
            if head["kind"] == "classification":
                scores = outputs[f"{prefix}scores"]
                vocabulary = np.array(head["vocabulary"], dtype=object)
                result[head["name"]] = vocabulary[scores.argmax(axis=1)]
                for j, label in enumerate(head["vocabulary"]):
                    result[f"{head['name']}_score_{label}"] = scores[:, j].astype(np.float64)
            else:
                key = "outputs" if i == 0 else head["name"]
                result[head["name"]] = outputs[key].reshape(-1).astype(np.float64)
        return pd.DataFrame(result)


set_model(SavedModelPyfunc())
