"""What a logged request held and what the model answered, read back from TF Serving
PredictionLog records for `loopline monitor`:

- the request's examples as tf.Examples keyed by the data's column names, as the pipeline's
  statistics read them: Classify/Regress/MultiInference examples (context merged in, as the
  server parses them), Predict's serialized `inputs`, or `predict_raw`'s one tensor per feature
  (a missing number is NaN and a missing string "" there, as in training: left out here). The
  model's label columns are dropped: clients may send them, the model ignores them;
- each head's predictions in the Evaluator's form: class scores in the head's vocabulary order
  (`[examples, classes]`), regression values (`[examples, 1]`), from whichever API answered.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tensorflow.core.example import example_pb2
from tensorflow_serving.apis import prediction_log_pb2

from serving import signature_names as names
from serving.request_log import holds_examples
from serving.request_limits import RequestLimits
from serving.tensors import to_numpy
from trainer.evaluation import evaluation_signature, prediction_key, read_description
from trainer.heads import CLASSIFICATION, Head

LOGGED = RequestLimits(max_elements=1 << 40)  # logged tensors were checked when they were served


@dataclass
class ServedModel:
    """The export's own description of a served version (assets.extra/loopline_signature.json)."""
    features: dict[str, str]  # column -> kind (float32, int64, string, image[...] ...)
    heads: list[Head]
    default_head: str
    layout: int
    column_of: dict[str, str]  # signature name -> column

    @classmethod
    def read(cls, saved_model_dir: str) -> "ServedModel":
        description = read_description(saved_model_dir)
        heads = [Head.from_json(h) for h in description["heads"]]
        columns = description.get("signature_names", {})
        return cls(description["features"], heads, description.get("default_head", heads[0].name),
                   description.get("layout", 1), {name: column for column, name in columns.items()})

    @property
    def label_columns(self) -> set[str]:
        return {h.label_column for h in self.heads}


def logged_examples(entry: prediction_log_pb2.PredictionLog, model: ServedModel) -> list[example_pb2.Example]:
    """The examples of a logged request, label columns left out."""
    kind = entry.WhichOneof("log_type")
    request = getattr(entry, kind).request
    if kind == "predict_log":
        examples = _predict_examples(request, model)
    else:
        which = request.input.WhichOneof("kind")
        listed = getattr(request.input, which) if which else None
        examples = list(listed.examples) if listed is not None else []
        if which == "example_list_with_context":
            examples = [_with_context(listed.context, e) for e in examples]
    for example in examples:
        for column in model.label_columns & set(example.features.feature):
            del example.features.feature[column]
    return examples


def _with_context(context: example_pb2.Example, example: example_pb2.Example) -> example_pb2.Example:
    merged = example_pb2.Example()
    merged.CopyFrom(context)
    merged.MergeFrom(example)  # the example's own value wins, as in the concatenated serialization TF Serving parses
    return merged


def _predict_examples(request, model: ServedModel) -> list[example_pb2.Example]:
    for key, tensor in request.inputs.items():
        if holds_examples(key, tensor) and key not in model.column_of:
            return [example_pb2.Example.FromString(v) for v in tensor.string_val]
    arrays = {key: to_numpy(tensor, key, LOGGED.budget()) for key, tensor in request.inputs.items()}
    rows = min((len(a) for a in arrays.values()), default=0)
    examples = [example_pb2.Example() for _ in range(rows)]
    for key, array in arrays.items():
        column = model.column_of.get(key, key)
        kind = model.features.get(column, "string" if array.dtype == object else "float32").split("[")[0]
        if kind == "image":
            continue  # predict_raw takes the decoded image; the statistics hold the encoded bytes
        for example, values in zip(examples, array.reshape(rows, -1)):
            _add_feature(example, column, kind, values)
    return examples


def _add_feature(example: example_pb2.Example, column: str, kind: str, values: np.ndarray) -> None:
    if kind == "string" or values.dtype == object:
        present = [v if isinstance(v, bytes) else str(v).encode() for v in values if v not in (b"", "")]
        if present:
            example.features.feature[column].bytes_list.value.extend(present)
        return
    numbers = values.astype(np.float64)
    numbers = numbers[~np.isnan(numbers)]
    if not numbers.size:
        return
    if kind == "int64" and np.all(np.isfinite(numbers)) and np.all(numbers == np.round(numbers)):
        example.features.feature[column].int64_list.value.extend(int(v) for v in numbers)
    else:  # a fraction sent for a whole-number feature stays a float: the type check reports it
        example.features.feature[column].float_list.value.extend(float(v) for v in numbers)


def logged_predictions(entry: prediction_log_pb2.PredictionLog, model: ServedModel) -> dict[str, np.ndarray]:
    """{head: scores [examples, classes] or values [examples, 1]} of a logged answer, for every
    head the answer holds."""
    kind = entry.WhichOneof("log_type")
    response = getattr(entry, kind).response
    if kind == "predict_log":
        return _predict_answer(response, model)
    if kind == "multi_inference_log":
        out = {}
        for result in response.results:
            head = _head_of(result.model_spec.signature_name, model)
            which = result.WhichOneof("result")
            if head is not None and which is not None:
                out[head.name] = _examples_answer(getattr(result, which), head)
        return out
    head = _head_of(response.model_spec.signature_name, model)
    return {} if head is None else {head.name: _examples_answer(response.result, head)}


def _head_of(signature: str, model: ServedModel) -> Head | None:
    """The head a Classify/Regress signature answers for (`serving_default`: the default head)."""
    by_name = {h.name: h for h in model.heads}
    if signature in ("", names.DEFAULT):
        return by_name.get(model.default_head) if model.layout >= 2 else None
    for head in model.heads:
        if signature in (names.classify(head.name), names.regress(head.name)):
            return head
    return None


def _examples_answer(result, head: Head) -> np.ndarray:
    if head.kind != CLASSIFICATION:
        return np.array([[r.value] for r in result.regressions], np.float32)
    position = {label: i for i, label in enumerate(head.vocabulary)}
    scores = np.zeros((len(result.classifications), len(head.vocabulary)), np.float32)
    for row, classification in zip(scores, result.classifications):
        for scored in classification.classes:
            if scored.label in position:
                row[position[scored.label]] = scored.score
    return scores


def _predict_answer(response, model: ServedModel) -> dict[str, np.ndarray]:
    signature = response.model_spec.signature_name
    if signature == names.PREDICT:
        keys = evaluation_signature(2, model.heads)[1]
    elif signature == names.PREDICT_RAW or (signature in ("", names.DEFAULT) and model.layout < 2):
        keys = {h.name: prediction_key(model.heads, h) for h in model.heads}
    else:  # Predict on one head's classify/regress signature
        head = _head_of(signature, model)
        keys = {} if head is None else {head.name: names.SCORES if head.kind == CLASSIFICATION else names.OUTPUTS}
    out = {}
    for head in model.heads:
        key = keys.get(head.name)
        if key in response.outputs:
            array = to_numpy(response.outputs[key], key, LOGGED.budget()).astype(np.float32)
            out[head.name] = array.reshape(len(array), -1)
    return out
