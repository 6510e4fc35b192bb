"""An MLflow pyfunc model over a loopline SavedModel ("models from code": MLflow copies this file
into the logged model, so loading it needs tensorflow, pandas and mlflow, not loopline).

Input: a DataFrame with one column per feature, named as in the data or as in the signature
(missing columns or values are treated as missing, as the SavedModel does). A model with list or
image features takes a list (or array) per cell, and the encoded image's bytes for an image; its
rows go to the SavedModel as tf.Examples (the `predict` signature, which parses and decodes them). Output: a DataFrame with, per head, the prediction (`<head>`: the class
for classification, the value for regression) and for classification one `<head>_score_<class>`
column per class. It calls the SavedModel's `predict_raw` signature.
"""
import json
import os

import mlflow.pyfunc
import numpy as np
import pandas as pd
from mlflow.models import set_model

# Copies of serving/signature_names.py, the one definition of the export contract: MLflow copies
# this file alone (models from code), so it cannot import it. tests/test_signature_names.py checks they are equal.
SIGNATURE_FILE = os.path.join("assets.extra", "loopline_signature.json")
PREDICT_RAW = "predict_raw"
PREDICT = "predict"
SCALAR_KINDS = ("int64", "float32", "string")


class SavedModelPyfunc(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        import tensorflow as tf

        self._tf = tf
        path = context.artifacts["saved_model"]
        loaded = tf.saved_model.load(path)
        self._predict = loaded.signatures[PREDICT_RAW]
        self._predict_examples = loaded.signatures.get(PREDICT)
        with open(os.path.join(path, SIGNATURE_FILE)) as f:
            description = json.load(f)
        self._features = description["features"]
        # {column: signature input name}; exports before it used the column names themselves
        self._inputs = description.get("signature_names", {})
        self._heads = description["heads"]

    # `pd.DataFrame`: the input is validated against the logged signature. MLflow infers no schema
    # from this hint (nor validates twice), and without a hint it warns each time the class is defined.
    def predict(self, context, model_input: pd.DataFrame, params=None):
        tf = self._tf
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        if any(kind not in SCALAR_KINDS for kind in self._features.values()):
            return self._answers(self._from_examples(frame), prefix_first=True)
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
        return self._answers({k: v.numpy() for k, v in self._predict(**inputs).items()}, prefix_first=False)

    def _from_examples(self, frame):
        """The rows as tf.Examples (keyed by the data's column names) through `predict`."""
        tf = self._tf
        records = []
        for _, row in frame.iterrows():
            example = tf.train.Example()
            for name, kind in self._features.items():
                given = name if name in frame.columns else self._inputs.get(name, name)
                value = row.get(given) if given in frame.columns else None
                values = [] if value is None else list(value) if isinstance(value, (list, tuple, np.ndarray)) else [value]
                values = [v for v in values if not (isinstance(v, float) and np.isnan(v))]
                if not values:
                    continue
                feature = example.features.feature[name]
                if kind.startswith(("string", "image")):
                    feature.bytes_list.value.extend(v if isinstance(v, bytes) else str(v).encode() for v in values)
                elif kind.startswith("int64"):
                    feature.int64_list.value.extend(int(v) for v in values)
                else:
                    feature.float_list.value.extend(float(v) for v in values)
            records.append(example.SerializeToString())
        outputs = self._predict_examples(inputs=tf.constant(records, tf.string))
        return {k: v.numpy() for k, v in outputs.items()}

    def _answers(self, outputs, prefix_first: bool):
        """`predict_raw` names the first head's outputs `scores`/`outputs`; `predict` prefixes every head's."""
        result = {}
        for i, head in enumerate(self._heads):
            prefix = "" if i == 0 and not prefix_first else f"{head['name']}_"
            if head["kind"] == "classification":
                scores = outputs[f"{prefix}scores"]
                vocabulary = np.array(head["vocabulary"], dtype=object)
                result[head["name"]] = vocabulary[scores.argmax(axis=1)]
                for j, label in enumerate(head["vocabulary"]):
                    result[f"{head['name']}_score_{label}"] = scores[:, j].astype(np.float64)
            else:
                key = f"{head['name']}_outputs" if prefix_first else "outputs" if i == 0 else head["name"]
                result[head["name"]] = outputs[key].reshape(-1).astype(np.float64)
        return pd.DataFrame(result)


set_model(SavedModelPyfunc())
