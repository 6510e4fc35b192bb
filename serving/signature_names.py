"""The export contract, in one place: signature names, method names, tensor names and the files
beside the SavedModel. The exporter, the server, the Evaluator and the MLflow model read it (as TF
Serving's exporter and server both read `signature_constants`). Only the standard library: anyone may import it.

TF Serving's names (tensorflow/python/saved_model/signature_constants.py):
- Classify needs one input `inputs` (serialized tf.Examples) and outputs `classes` (DT_STRING,
  [batch, classes]) and/or `scores` (DT_FLOAT, [batch, classes]); method `tensorflow/serving/classify`.
- Regress needs one input `inputs` and one output `outputs` ([batch] or [batch, 1]); method
  `tensorflow/serving/regress`.
"""

import os
import re
import unicodedata

DEFAULT = "serving_default"
PREDICT = "predict"  # tf.Example in, every head's outputs as `<head>_classes`/`<head>_scores`/`<head>_outputs`
PREDICT_RAW = "predict_raw"  # one [batch, 1] tensor per feature; JSON clients, TFLite, MLflow

CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
PREDICT_METHOD = "tensorflow/serving/predict"

INPUTS = "inputs"
CLASSES = "classes"
SCORES = "scores"
OUTPUTS = "outputs"

ASSETS_EXTRA = "assets.extra"
SIGNATURE_FILE = "loopline_signature.json"  # feature kinds and heads, for readers without TensorFlow
WARMUP_FILE = "tf_serving_warmup_requests"  # TF Serving's name (saved_model_warmup_util.h)
WARMUP_MAX_RECORDS = 1000  # TF Serving's WarmupConsts::kMaxNumRecords
TFLITE_MODEL_FILE = "model.tflite"  # in a version folder, what --prefer_tflite_model serves (saved_model_bundle_factory.cc)



def signature_file(saved_model_dir: str) -> str:
    """Where an export keeps SIGNATURE_FILE."""
    return os.path.join(saved_model_dir, ASSETS_EXTRA, SIGNATURE_FILE)


def warmup_file(saved_model_dir: str) -> str:
    """Where an export keeps TF Serving's warmup records."""
    return os.path.join(saved_model_dir, ASSETS_EXTRA, WARMUP_FILE)


# Layout of the signatures, recorded in SIGNATURE_FILE. Exports without it (layout 1) have
# `serving_default` with every head's outputs (`classes`/`scores` or `outputs` for the first head,
# `<head>_classes`/`<head>_scores` or `<head>` for the others) and `predict_raw`.
LAYOUT = 2


def classify(head: str) -> str:
    return f"classify_{head}"


def regress(head: str) -> str:
    return f"regress_{head}"


def head_output(head: str, output: str) -> str:
    """A head's output in the `predict` signature: `<head>_classes`, `<head>_scores`, `<head>_outputs`."""
    return f"{head}_{output}"


_VALID = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def signature_name(column: str) -> str:
    """The one rule from a data column's name to its name in the model and the signatures (input,
    head, output, metric prefix): a name that is already [A-Za-z_][A-Za-z0-9_]* stays as it is;
    otherwise accents are dropped (é -> e), every run of other characters becomes one "_",
    "_" at either end is dropped, and "f_" goes in front of a name that is then empty or starts
    with a digit. "sepal length (cm)" -> "sepal_length_cm", "Größe-2" -> "Groe_2", "2nd" -> "f_2nd"."""
    if _VALID.fullmatch(column):
        return column
    text = unicodedata.normalize("NFKD", column).encode("ascii", "ignore").decode()
    name = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")
    return name if name and not name[0].isdigit() else f"f_{name}"


def signature_names_of(columns) -> dict[str, str]:
    """{column: signature name} for every column; two columns with one name are an error naming both."""
    out: dict[str, str] = {}
    taken: dict[str, str] = {}
    for column in columns:
        name = signature_name(column)
        if name in taken:
            raise ValueError(f"columns '{taken[name]}' and '{column}' both become '{name}' in the model's "
                             "signatures (see signature_name); rename one of them")
        taken[name] = column
        out[column] = name
    return out
