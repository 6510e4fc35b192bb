"""REST front end, shaped like TF Serving's:

  GET  /v1/models/{name}[/versions/{v}|/labels/{l}]            model status
  GET  /v1/models/{name}[/versions/{v}|/labels/{l}]/metadata   signatures
  POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict    {"instances": [...]} or {"inputs": ...}
  POST ...:classify | ...:regress                              {"examples": [{feature: value}], "context": {...}}
  GET  /monitoring/prometheus/metrics                          Prometheus text
"""
from __future__ import annotations

import base64
import json
import logging
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import numpy as np
from google.protobuf import json_format
from tensorflow.core.example import example_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_pb2,
    regression_pb2,
)

from serving import service
from serving.config import ServingConfig
from serving.config_writer import PROMETHEUS_PATH
from serving.errors import ServingError, invalid
from serving.manager import ModelManager
from serving.metrics import Metrics

log = logging.getLogger("loopline.serving")

_ROUTE = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+)|/labels/(?P<label>[^/:]+))?"
                    r"(?:(?P<metadata>/metadata)|:(?P<verb>predict|classify|regress))?/?$")


def _spec(match) -> model_pb2.ModelSpec:
    spec = model_pb2.ModelSpec(name=match["name"])
    if match["version"]:
        spec.version.value = int(match["version"])
    elif match["label"]:
        spec.version_label = match["label"]
    return spec


def _decode(value):
    """JSON value -> numpy-friendly value; {"b64": ...} is binary (TF Serving's convention)."""
    if isinstance(value, dict):
        if set(value) == {"b64"}:
            return base64.b64decode(value["b64"])
        raise invalid(f"unexpected object {value!r} in a tensor (only {{\"b64\": ...}} is allowed)")
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _array(value, dtype_enum: int, name: str) -> np.ndarray:
    from tensorflow.python.framework import dtypes

    dtype = dtypes.as_dtype(dtype_enum)
    decoded = _decode(value)
    try:
        if dtype.is_floating or dtype.is_integer or dtype.is_bool:
            if _has_strings(decoded):
                raise ValueError("strings in a numeric tensor")
            return np.array(decoded, dtype=dtype.as_numpy_dtype)
        array = np.array(decoded, dtype=object)
        flat = array.reshape(-1)
        for i, v in enumerate(flat):
            if not isinstance(v, (str, bytes)):
                raise ValueError(f"non-string value {v!r}")
            flat[i] = v.encode() if isinstance(v, str) else v
        return array
    except (ValueError, TypeError) as exc:
        raise invalid(f"input '{name}': cannot read it as a {dtype.name} tensor: {exc}") from None


def _has_strings(value) -> bool:
    if isinstance(value, list):
        return any(_has_strings(v) for v in value)
    return isinstance(value, (str, bytes))


def _jsonable(array: np.ndarray):
    if array.dtype == object:
        return [_jsonable(v) if isinstance(v, np.ndarray) else _text(v) for v in array] if array.ndim else _text(array.item())
    return array.tolist()


def _text(value):
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(value).decode()}
    return value


def _predict(manager: ModelManager, spec, body: dict) -> dict:
    signature_name = body.get("signature_name", "")
    spec.signature_name = signature_name
    with manager.resolve(spec) as servable:
        sig = servable.signature(signature_name)
        names = sorted(sig.inputs)
        if ("instances" in body) == ("inputs" in body):
            raise invalid('the body needs exactly one of "instances" (row format) or "inputs" (columnar format)')
        if "instances" in body:
            rows = body["instances"]
            if not isinstance(rows, list) or not rows:
                raise invalid('"instances" must be a non-empty list')
            if all(isinstance(r, dict) and "b64" not in r for r in rows):
                missing = [n for n in names if n not in rows[0]]
                if missing or any(set(r) != set(rows[0]) for r in rows):
                    raise invalid(f"every instance needs the same named inputs {names}; missing {missing}")
                columns = {n: [r[n] for r in rows] for n in rows[0]}
            elif len(names) == 1:
                columns = {names[0]: rows}
            else:
                raise invalid(f"signature takes inputs {names}: each instance must be an object with those keys")
            row_format = True
        else:
            given = body["inputs"]
            columns = given if isinstance(given, dict) else ({names[0]: given} if len(names) == 1 else None)
            if columns is None:
                raise invalid(f"signature takes inputs {names}: \"inputs\" must be an object with those keys")
            row_format = False
        inputs = {}
        for n, v in columns.items():
            if n not in sig.inputs:
                raise invalid(f"input '{n}' is not in the signature's inputs {names}")
            inputs[n] = _array(v, sig.inputs[n].dtype, n)
        outputs = servable.run(signature_name, inputs, body.get("output_filter", ()))
    if row_format:
        if len(outputs) == 1:
            return {"predictions": _jsonable(next(iter(outputs.values())))}
        keys = sorted(outputs)
        count = next(iter(outputs.values())).shape[0]
        return {"predictions": [{k: _jsonable(outputs[k][i:i + 1])[0] for k in keys} for i in range(count)]}
    if len(outputs) == 1:
        return {"outputs": _jsonable(next(iter(outputs.values())))}
    return {"outputs": {k: _jsonable(v) for k, v in outputs.items()}}


def _example(features: dict, kinds: dict) -> example_pb2.Example:
    example = example_pb2.Example()
    for name, value in features.items():
        values = value if isinstance(value, list) else [value]
        feature = example.features.feature[name]
        kind = kinds.get(name)
        values = [_decode(v) for v in values]
        if kind == "string" or (kind is None and values and isinstance(values[0], (str, bytes))):
            feature.bytes_list.value.extend(v.encode() if isinstance(v, str) else v for v in values)
        elif kind == "int64" or (kind is None and all(isinstance(v, int) for v in values)):
            feature.int64_list.value.extend(int(v) for v in values)
        else:
            try:
                feature.float_list.value.extend(float(v) for v in values)
            except (TypeError, ValueError):
                raise invalid(f"feature '{name}': {value!r} is not a number") from None
    return example


def _examples_request(manager: ModelManager, spec, body: dict, request):
    examples = body.get("examples")
    if not isinstance(examples, list) or not examples:
        raise invalid('the body needs "examples": a non-empty list of objects')
    spec.signature_name = body.get("signature_name", "")
    with manager.resolve(spec) as servable:
        kinds = servable.description.get("features", {})
        version = servable.version
    request.model_spec.CopyFrom(spec)
    # The examples are built with this version's feature kinds: run them on the same version,
    # even if a newer one is swapped in meanwhile (the label or "latest" is resolved once).
    request.model_spec.version.value = version
    context = body.get("context")
    target = request.input.example_list_with_context if context else request.input.example_list
    if context:
        target.context.CopyFrom(_example(context, kinds))
    for e in examples:
        if not isinstance(e, dict):
            raise invalid(f"each example must be an object of features, got {e!r}")
        target.examples.append(_example(e, kinds))
    return request


def _classify(manager, spec, body):
    request = _examples_request(manager, spec, body, classification_pb2.ClassificationRequest())
    response = service.classify(manager, request)
    return {"results": [[[c.label, c.score] for c in item.classes] for item in response.result.classifications]}


def _regress(manager, spec, body):
    request = _examples_request(manager, spec, body, regression_pb2.RegressionRequest())
    response = service.regress(manager, request)
    return {"results": [r.value for r in response.result.regressions]}


def _status(manager, spec):
    request = get_model_status_pb2.GetModelStatusRequest(model_spec=spec)
    return json_format.MessageToDict(service.model_status(manager, request), preserving_proto_field_name=True)


def _metadata(manager, spec):
    request = get_model_metadata_pb2.GetModelMetadataRequest(model_spec=spec, metadata_field=["signature_def"])
    response = service.metadata(manager, request)
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(signature_map)
    return {"model_spec": json_format.MessageToDict(response.model_spec, preserving_proto_field_name=True),
            "metadata": {"signature_def": json_format.MessageToDict(signature_map, preserving_proto_field_name=True)}}


def make_handler(manager: ModelManager, metrics: Metrics, config: ServingConfig):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "loopline"

        def log_message(self, fmt, *args):  # the access log is the metrics, not stderr
            pass

        def _send(self, status: int, payload, content_type="application/json"):
            body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _route(self, method: str):
            started = time.perf_counter()
            path = self.path.split("?", 1)[0]
            if method == "GET" and path == PROMETHEUS_PATH:
                return self._send(200, metrics.render().encode(), "text/plain; version=0.0.4")
            match = _ROUTE.match(path)
            name, verb, code = "", "", "OK"
            try:
                if match is None:
                    raise ServingError(grpc.StatusCode.NOT_FOUND, f"no such endpoint: {method} {path}")
                name = match["name"]
                spec = _spec(match)
                verb = match["verb"] or ("metadata" if match["metadata"] else "status")
                if (method == "POST") != bool(match["verb"]):
                    raise invalid(f"{method} is not allowed on {path}")
                if method == "GET":
                    payload = _metadata(manager, spec) if match["metadata"] else _status(manager, spec)
                else:
                    body = self._body()
                    payload = {"predict": _predict, "classify": _classify, "regress": _regress}[verb](manager, spec, body)
                self._send(200, payload)
            except ServingError as exc:
                code = exc.code.name
                self._send(exc.http_status, {"error": exc.message})
            except Exception as exc:  # noqa: BLE001
                code = "INTERNAL"
                log.exception("REST %s %s failed", method, path)
                self._send(500, {"error": f"{type(exc).__name__}: {exc}"})
            finally:
                metrics.observe("rest", name, verb, code, time.perf_counter() - started)

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            if length > config.max_request_bytes:
                self.close_connection = True
                raise ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   f"request body of {length} bytes is over the limit of {config.max_request_bytes}")
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise invalid(f"the body is not valid JSON: {exc}") from None
            if not isinstance(body, dict):
                raise invalid("the body must be a JSON object")
            return body

        def do_GET(self):
            self._route("GET")

        def do_POST(self):
            self._route("POST")

    return Handler


def start_rest(manager: ModelManager, metrics: Metrics, config: ServingConfig) -> tuple[ThreadingHTTPServer, int]:
    server = ThreadingHTTPServer((config.host, config.rest_port), make_handler(manager, metrics, config))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="rest", daemon=True).start()
    return server, server.server_address[1]
