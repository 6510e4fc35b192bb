"""A client for TF Serving's APIs (ours or the real server): reads rows from JSON or CSV, sends
them to the `predict_raw` signature over gRPC or REST, and formats class names with scores and
regression values. Missing numbers go as NaN and missing strings as "", as in training."""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import grpc
import numpy as np
from tensorflow_serving.apis import get_model_metadata_pb2, predict_pb2, prediction_service_pb2_grpc

from ingestion.csv_options import CsvOptions, parse_header, undecodable
from serving import signature_names as names
from serving.request_limits import RequestLimits
from serving.tensors import from_numpy, to_numpy

RAW_SIGNATURE = names.PREDICT_RAW


def read_rows(path: str, csv_options: CsvOptions | None = None) -> list[dict]:
    """A JSON list of objects, JSON lines, or a CSV with a header row, read by the pipeline's CSV
    rules (`ingestion.csv_options`: the missing markers, delimiter and encoding of data.*)."""
    if path.endswith(".csv"):
        return _csv_rows(path, csv_options or CsvOptions())
    text = Path(path).read_text()
    stripped = text.lstrip()
    try:
        rows = json.loads(text) if stripped.startswith("[") else [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON (a list of objects or one object per line): {exc}") from None
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: expected a non-empty list of objects (one per row)")
    return rows


def _csv_rows(path: str, options: CsvOptions) -> list[dict]:
    """The rows as dicts; a cell holding a missing marker is None (missing), as ExampleGen reads it."""
    data = Path(path).read_bytes()
    names, options = parse_header(path, data, True, options)
    try:
        text = data.decode(options.encoding).removeprefix("\ufeff")
    except UnicodeDecodeError:
        raise undecodable(path, [data], options.encoding) from None
    missing = set(options.na_values)
    records = csv.reader(io.StringIO(text, newline=""), delimiter=options.delimiter)
    next(records)  # the header, read by parse_header
    return [{name: None if cell in missing else cell for name, cell in zip(names, record)} for record in records if record]


def _number(value, name: str, row: int) -> float:
    if value is None or value == "" or (isinstance(value, str) and value.upper() == "NA"):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"row {row}, column '{name}': {value!r} is not a number") from None


def _list_column(rows: list[dict], name: str, dtype: str, shape: list[int]) -> np.ndarray:
    """A list (or nested lists) per row, for an input of `shape` ([-1, ...]): a flat list shorter
    than a one-dimensional input is padded as missing; anything else must fit exactly."""
    missing = "" if dtype == "string" else math.nan
    width = shape[1] if len(shape) == 2 and shape[1] > 0 else None
    out = []
    for i, row in enumerate(rows):
        value = row.get(name)
        value = [] if value is None else value if isinstance(value, list) else [value]
        if width is not None:
            if len(value) > width:
                raise ValueError(f"row {i}, column '{name}': {len(value)} values; the model takes at most {width}")
            value = value + [missing] * (width - len(value))
        out.append(value)
    if dtype == "string":
        return np.array([[str(v).encode() for v in value] for value in out], dtype=object)
    try:
        array = np.array(out, dtype=np.float32)
    except ValueError:
        raise ValueError(f"column '{name}': the rows' lists do not form the input's shape {shape[1:]}") from None
    if list(array.shape[1:]) != [d for d in shape[1:]]:
        raise ValueError(f"column '{name}': the rows give shape {list(array.shape[1:])}, the model takes {shape[1:]}")
    return array


def rows_to_columns(rows: list[dict], input_dtypes: dict[str, str],
                    shapes: dict[str, list[int]] | None = None) -> dict[str, np.ndarray]:
    """{input name: [n, 1] array} for inputs typed 'float' or 'string'; an input of another shape
    (a list, a fixed shape) takes a list per row (`_list_column`)."""
    columns = {}
    for name, dtype in input_dtypes.items():
        shape = (shapes or {}).get(name)
        if shape is not None and len(shape) >= 2 and shape[1:] != [1]:
            columns[name] = _list_column(rows, name, dtype, shape)
            continue
        if dtype == "string":
            values = [("" if r.get(name) is None else str(r.get(name))).encode() for r in rows]
            columns[name] = np.array(values, dtype=object).reshape(-1, 1)
        else:
            columns[name] = np.array([_number(r.get(name), name, i) for i, r in enumerate(rows)], np.float32).reshape(-1, 1)
    return columns


def describe(outputs: dict[str, np.ndarray]) -> list[str]:
    """One line per row: `head=class (score)` for classifier heads, `head=value` for regressions."""
    n = next(iter(outputs.values())).shape[0]
    lines = []
    for i in range(n):
        parts = []
        for key in sorted(outputs):
            if key.endswith(names.CLASSES):
                scores = outputs[key[: -len(names.CLASSES)] + names.SCORES][i].reshape(-1)
                classes = outputs[key][i].reshape(-1)
                best = int(np.argmax(scores))
                label = classes[best].decode() if isinstance(classes[best], bytes) else str(classes[best])
                head = key[: -len(names.CLASSES)].rstrip("_") or "class"
                parts.append(f"{head}={label} ({scores[best]:.3f})")
            elif not key.endswith(names.SCORES):
                parts.append(f"{key}={float(outputs[key][i].reshape(-1)[0]):.4g}")
        lines.append(f"row {i}: " + "  ".join(parts))
    return lines


class GrpcClient:
    def __init__(self, target: str, timeout: float = 30.0, root_certificate: bytes | None = None):
        self.channel = (grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificate))
                        if root_certificate else grpc.insecure_channel(target))
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.timeout = timeout

    def input_specs(self, model: str, signature: str) -> dict[str, tuple[str, list[int]]]:
        """{input: (dtype "string" or "float", shape with -1 for the batch)} from the model's metadata."""
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = model
        response = self.stub.GetModelMetadata(request, timeout=self.timeout)
        signatures = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signatures)
        if signature not in signatures.signature_def:
            raise ValueError(f"model {model!r} has no signature {signature!r} (has {sorted(signatures.signature_def)})")
        from tensorflow.core.framework import types_pb2

        return {k: ("string" if v.dtype == types_pb2.DT_STRING else "float", [d.size for d in v.tensor_shape.dim])
                for k, v in signatures.signature_def[signature].inputs.items()}

    def input_dtypes(self, model: str, signature: str) -> dict[str, str]:
        return {k: dtype for k, (dtype, _) in self.input_specs(model, signature).items()}

    def predict(self, model: str, columns: dict[str, np.ndarray], signature: str) -> dict[str, np.ndarray]:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model
        request.model_spec.signature_name = signature
        for name, array in columns.items():
            from_numpy(array, request.inputs[name])
        response = self.stub.Predict(request, timeout=self.timeout)
        answers = RequestLimits(max_elements=1 << 30).budget()  # the server's answer, read as it is
        return {k: to_numpy(v, k, answers) for k, v in response.outputs.items()}

    def close(self):
        self.channel.close()


class RestClient:
    def __init__(self, base_url: str, timeout: float = 30.0):
        import requests

        self.session, self.base, self.timeout = requests.Session(), base_url.rstrip("/"), timeout

    def _check(self, response):
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.json().get('error', response.text)}")
        return response.json()

    def input_specs(self, model: str, signature: str) -> dict[str, tuple[str, list[int]]]:
        meta = self._check(self.session.get(f"{self.base}/v1/models/{model}/metadata", timeout=self.timeout))
        sigs = meta["metadata"]["signature_def"]["signature_def"]
        if signature not in sigs:
            raise ValueError(f"model {model!r} has no signature {signature!r} (has {sorted(sigs)})")
        return {k: ("string" if v["dtype"] == "DT_STRING" else "float",
                    [int(d["size"]) for d in v.get("tensor_shape", {}).get("dim", [])])
                for k, v in sigs[signature]["inputs"].items()}

    def input_dtypes(self, model: str, signature: str) -> dict[str, str]:
        return {k: dtype for k, (dtype, _) in self.input_specs(model, signature).items()}

    def predict(self, model: str, columns: dict[str, np.ndarray], signature: str) -> dict[str, np.ndarray]:
        # Python's json writes NaN (a missing number) as `NaN`, which TF Serving's REST API reads.
        inputs = {k: _json_value(a.tolist()) for k, a in columns.items()}
        body = json.dumps({"signature_name": signature, "inputs": inputs})
        out = self._check(self.session.post(f"{self.base}/v1/models/{model}:predict", data=body, timeout=self.timeout))
        outputs = out["outputs"]
        if not isinstance(outputs, dict):
            outputs = {"outputs": outputs}
        return {k: np.array([[x.encode() if isinstance(x, str) else x for x in row] for row in v], dtype=object)
                if v and isinstance(v[0], list) and v[0] and isinstance(v[0][0], str) else np.array(v) for k, v in outputs.items()}

    def close(self):
        self.session.close()


def _json_value(value):
    """Nested lists for TF Serving's REST API: text as it is, other bytes as {"b64": ...}."""
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            import base64

            return {"b64": base64.b64encode(value).decode()}
    return value


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp")


def predict_images(paths: list[str], model: str, client, feature: str = "image") -> list[str]:
    """Image files, each sent as a tf.Example with its encoded bytes in `feature` (an
    image_folder's feature) to the `predict` signature, which decodes them in the graph."""
    from tensorflow.core.example import example_pb2

    records = []
    for path in paths:
        example = example_pb2.Example()
        example.features.feature[feature].bytes_list.value.append(Path(path).read_bytes())
        records.append(example.SerializeToString())
    outputs = client.predict(model, {names.INPUTS: np.array(records, dtype=object)}, names.PREDICT)
    return [f"{path}: {line.split(': ', 1)[1]}" for path, line in zip(paths, describe(outputs))]


def predict_rows(rows: list[dict], model: str, client, signature: str = RAW_SIGNATURE) -> list[str]:
    """Rows keyed by the data's column names ("sepal length (cm)") or by the signature's input
    names ("sepal_length_cm"): names.signature_name maps one to the other."""
    rows = [{names.signature_name(key): value for key, value in row.items()} for row in rows]
    specs = client.input_specs(model, signature)
    dtypes = {name: dtype for name, (dtype, _) in specs.items()}
    outputs = client.predict(model, rows_to_columns(rows, dtypes, {name: shape for name, (_, shape) in specs.items()}),
                             signature)
    return describe(outputs)


def wait_until_serving(client, model: str, seconds: float, signature: str = RAW_SIGNATURE) -> None:
    """Polls the model's metadata until it answers (a server still starting or loading)."""
    import time

    deadline = time.monotonic() + seconds
    while True:
        try:
            client.input_dtypes(model, signature)
            return
        except Exception as exc:  # noqa: BLE001 - only "not up yet" is retried, until the deadline
            if not _not_up_yet(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _not_up_yet(exc: Exception) -> bool:
    """A server still starting (nothing listening) or still loading the model."""
    if isinstance(exc, grpc.RpcError):
        return exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND)
    import requests

    return isinstance(exc, requests.ConnectionError) or (isinstance(exc, RuntimeError) and str(exc).startswith("HTTP 404"))
