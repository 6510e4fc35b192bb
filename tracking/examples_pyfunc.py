"""An MLflow pyfunc model over a SavedModel loopline did not export (a TFX run_fn's), whose
signature takes serialized tf.Examples ("models from code": MLflow copies this file alone into
the logged model, so loading it needs tensorflow, pandas and mlflow, not loopline).

Input: a DataFrame with one column per raw feature (the data's column names). Each row becomes a
tf.Example: a column's kind (int64, float32 or string, the `features` of the `examples_spec`
artifact) says which list its value goes in; a missing value leaves the feature out, as in the
data; a list or array cell goes in whole. Output: a DataFrame with one column per signature
output, and `<output>_<i>` columns for an output of several values per row (a classifier's
scores or logits).
"""
import json

import mlflow.pyfunc
import numpy as np
import pandas as pd
from mlflow.models import set_model


class ExamplesPyfunc(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        import tensorflow as tf

        self._tf = tf
        with open(context.artifacts["examples_spec"]) as f:
            spec = json.load(f)
        self._features, self._input = spec["features"], spec["input"]
        self._call = tf.saved_model.load(context.artifacts["saved_model"]).signatures[spec["signature"]]

    def predict(self, context, model_input: pd.DataFrame, params=None):
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        records = [self._example(row).SerializeToString() for _, row in frame.iterrows()]
        outputs = self._call(**{self._input: self._tf.constant(records, self._tf.string)})
        result = {}
        for name, value in sorted(outputs.items()):
            value = value.numpy().reshape(len(records), -1)
            if value.shape[1] == 1:
                result[name] = value[:, 0]
            else:
                result.update({f"{name}_{i}": value[:, i] for i in range(value.shape[1])})
        return pd.DataFrame({k: v.astype(np.float64) if v.dtype.kind in "fiu" else v for k, v in result.items()})

    def _example(self, row):
        example = self._tf.train.Example()
        for name, kind in self._features.items():
            value = row.get(name) if name in row.index else None
            values = list(value) if isinstance(value, (list, tuple, np.ndarray)) else [] if value is None else [value]
            values = [v for v in values if not (isinstance(v, float) and np.isnan(v))]
            if not values:
                continue
            feature = example.features.feature[name]
            if kind == "string":
                feature.bytes_list.value.extend(v if isinstance(v, bytes) else str(v).encode() for v in values)
            elif kind == "int64":
                feature.int64_list.value.extend(int(v) for v in values)
            else:
                feature.float_list.value.extend(float(v) for v in values)
        return example


set_model(ExamplesPyfunc())
