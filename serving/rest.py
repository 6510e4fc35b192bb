"""REST front end, TF Serving's (model_servers/http_rest_api_handler.cc, http_server.cc), served
by uvicorn with httptools' parser (HTTP/1.1 keep-alive, TCP_NODELAY: a kept-alive connection does
not wait on delayed ACKs):

  GET  /v1/models/{name}[/versions/{v}|/labels/{l}]            model status
  GET  /v1/models/{name}[/versions/{v}|/labels/{l}]/metadata   signatures
  POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict    {"instances": ...} or {"inputs": ...}
  POST ...:classify | ...:regress                              {"examples": [...], "context": {...}}
  GET  /monitoring/prometheus/metrics                          Prometheus text (path and presence: ServerOptions)
  OPTIONS /v1/...                                              CORS preflight

Each request is turned into the gRPC API's request and answered by the same code
(serving/service.py); the JSON codec is serving/json_codec.py. Errors are `{"error": message}`
with TF Serving's HTTP status for the code.
"""
from __future__ import annotations

import asyncio
import logging
import re
import socket
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import grpc
from google.protobuf import json_format
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_pb2,
    regression_pb2,
)

from serving import json_codec, request_ids, rules, service
from serving.config import ServingConfig
from serving.errors import ServingError, invalid
from serving.manager import ModelManager
from serving.metrics import Metrics
from serving.options import ServerOptions

log = logging.getLogger("loopline.serving")

# http_rest_api_util.cc's kPredictionApiGegex and kModelStatusApiRegex (full matches).
_PREDICTION = re.compile(r"(?i)/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)")
_STATUS = re.compile(r"(?i)/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?")
_API_PATH = re.compile(r"(?i)/v1/.*")  # kHTTPRestApiHandlerPathRegex: anything else is not ours (404)


def _model_spec(name: str, version: str | None, label: str | None) -> model_pb2.ModelSpec:
    """FillModelSpecWithNameVersionAndLabel, after ParseModelInfo's URL-decoding."""
    spec = model_pb2.ModelSpec(name=urllib.parse.unquote(name))
    if version:
        if int(version) >= 2**63:  # absl::SimpleAtoi into an int64
            raise invalid(f"Failed to convert version: {version} to numeric.")
        spec.version.value = int(version)
    if label:
        spec.version_label = urllib.parse.unquote(label)
    return spec


def _input_dtypes(manager: ModelManager, spec, signature_name: str) -> dict[str, int]:
    """GetInfoMap: the signature's inputs, from the version the spec resolves to now."""
    with manager.resolve(spec) as servable:
        key = rules.signature_key(signature_name)
        signature = servable.signature_defs.get(key)
        if signature is None:
            raise invalid(f'Serving signature name: "{key}" not found in signature def')
        return {name: info.dtype for name, info in signature.inputs.items()}


def predict(manager: ModelManager, spec, body: bytes) -> dict:
    """ProcessPredictRequest: JSON -> named arrays -> the Predict API's own path."""
    doc = json_codec.parse_body(body, manager.limits.max_elements)
    spec.signature_name = json_codec.signature_name(doc)
    inputs, row_format = json_codec.predict_inputs(doc, _input_dtypes(manager, spec, spec.signature_name),
                                                   spec.signature_name, manager.limits.budget())
    with manager.resolve(spec) as servable:
        outputs = service.run_predict(servable, spec.signature_name, inputs, (), manager.method_check)
    manager.request_log.log_predict(spec, servable.version, inputs, outputs)
    return json_codec.predict_answer(outputs, row_format)


def classify(manager: ModelManager, spec, body: bytes) -> dict:
    request = classification_pb2.ClassificationRequest(model_spec=spec)
    doc = json_codec.parse_body(body, manager.limits.max_elements)
    request.model_spec.signature_name = json_codec.signature_name(doc)
    json_codec.fill_examples(doc, request.input)
    return json_codec.classify_answer(service.classify(manager, request).result)


def regress(manager: ModelManager, spec, body: bytes) -> dict:
    request = regression_pb2.RegressionRequest(model_spec=spec)
    doc = json_codec.parse_body(body, manager.limits.max_elements)
    request.model_spec.signature_name = json_codec.signature_name(doc)
    json_codec.fill_examples(doc, request.input)
    return json_codec.regress_answer(service.regress(manager, request).result)


def status(manager: ModelManager, spec) -> dict:
    """ProcessModelStatusRequest: GetModelStatusResponse as JSON, every field printed."""
    response = service.model_status(manager, get_model_status_pb2.GetModelStatusRequest(model_spec=spec))
    return json_format.MessageToDict(response, always_print_fields_with_no_presence=True)


def metadata(manager: ModelManager, spec) -> dict:
    request = get_model_metadata_pb2.GetModelMetadataRequest(model_spec=spec, metadata_field=[rules.SIGNATURE_DEF_FIELD])
    response = service.metadata(manager, request)
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    response.metadata[rules.SIGNATURE_DEF_FIELD].Unpack(signature_map)
    as_dict = lambda m: json_format.MessageToDict(m, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return {"model_spec": as_dict(response.model_spec), "metadata": {rules.SIGNATURE_DEF_FIELD: as_dict(signature_map)}}


_VERBS = {"predict": predict, "classify": classify, "regress": regress}


def handle(manager: ModelManager, method: str, path: str, body: bytes) -> dict:
    """HttpRestApiHandler::ProcessRequest: the answer; raises ServingError."""
    if method == "POST" and (match := _PREDICTION.fullmatch(path)):
        name, version, label, verb = match.groups()
        if verb in _VERBS:  # the pattern ignores case, the dispatch does not
            return _VERBS[verb](manager, _model_spec(name, version, label), body)
    elif method == "GET" and (match := _STATUS.fullmatch(path)):
        name, version, label, subresource = match.groups()
        if not name:
            raise invalid("Missing model name in request.")
        spec = _model_spec(name, version, label)
        if subresource == "metadata":
            return metadata(manager, spec)
        return status(manager, spec)
    raise invalid(f"Malformed request: {method} {path}")


def _metric_labels(method: str, path: str) -> tuple[str, str]:
    """(model, API method) of a request, for the metrics, also when it fails."""
    if method == "POST" and (match := _PREDICTION.fullmatch(path)):
        return match[1], match[4]
    if method == "GET" and (match := _STATUS.fullmatch(path)):
        return match[1] or "", "metadata" if match[4] else "status"
    return "", ""


class RestApp:
    """The ASGI application: reads the body, answers, writes one JSON answer. A lone request is
    answered on the event loop's thread (a hand-off to a worker costs more than a small model's
    call); while one is being answered, the next go to worker threads, where model calls release
    the GIL and concurrent requests meet in the server-side batcher. With a timeout
    (--rest_api_timeout_in_ms) every request goes to a worker, and one over it is answered 504."""

    def __init__(self, manager: ModelManager, metrics: Metrics, config: ServingConfig, options: ServerOptions | None = None):
        self.manager, self.metrics, self.config = manager, metrics, config
        self.options = options or ServerOptions()
        self.pool = ThreadPoolExecutor(max_workers=self.options.rest_threads or config.grpc_workers,
                                       thread_name_prefix="rest")
        self.in_flight = 0  # only touched on the event loop's thread
        self.headers = _CORS_HEADERS if self.options.rest_cors else []

    def answer(self, method: str, path: str, body: bytes, too_large: bool, request_id: str = "") -> tuple[int, bytes, str]:
        started = time.perf_counter()
        name, verb = _metric_labels(method, path)
        code = "OK"
        try:
            request_ids.begin(request_id)  # checked, and CURRENT in the thread that answers
            if too_large:
                raise ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   f"request body is over the limit of {self.config.max_request_bytes} bytes "
                                   "(serving.max_request_bytes)")
            payload = handle(self.manager, method, path, body)
            return 200, json_codec.dumps(payload), "application/json"
        except ServingError as exc:
            code = exc.code.name
            status = 413 if too_large else exc.http_status
            return status, json_codec.dumps({"error": exc.message}), "application/json"
        except Exception as exc:  # noqa: BLE001 - a bug answers 500, the server keeps serving
            code = "INTERNAL"
            log.exception("REST %s %s failed", method, path)
            return 500, json_codec.dumps({"error": f"{type(exc).__name__}: {exc}"}), "application/json"
        finally:
            self.metrics.observe("rest", name, verb, code, time.perf_counter() - started)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        if method == "GET" and self.options.prometheus_path and path == self.options.prometheus_path:
            return await _send(send, 200, self.metrics.render().encode(), "text/plain; version=0.0.4")
        if not _API_PATH.fullmatch(path):
            return await _send(send, 404, json_codec.dumps({"error": f"Not found: {method} {path}"}), "application/json")
        if method == "OPTIONS":  # a CORS preflight, answered as TF Serving answers it
            status, payload = _preflight(scope)
            return await _send(send, status, payload, "application/json", extra=self.headers)
        body, too_large = await _read_body(receive, self.config.max_request_bytes)
        request_id = request_ids.from_asgi(scope["headers"])  # returned in the answer's x-request-id
        self.in_flight += 1
        try:
            await asyncio.sleep(0)  # requests that arrived with this one count themselves in first
            status, payload, content_type = await self._answer(method, path, body, too_large, request_id)
        finally:
            self.in_flight -= 1
        await _send(send, status, payload, content_type, close=too_large,
                    extra=[*self.headers, *request_ids.answer_header(request_id)])

    async def _answer(self, method: str, path: str, body: bytes, too_large: bool, request_id: str) -> tuple[int, bytes, str]:
        timeout_ms = self.options.rest_timeout_ms
        if self.in_flight == 1 and not timeout_ms:
            return self.answer(method, path, body, too_large, request_id)
        work = asyncio.get_running_loop().run_in_executor(self.pool, self.answer, method, path, body, too_large,
                                                          request_id)
        if not timeout_ms:
            return await work
        try:
            return await asyncio.wait_for(work, timeout_ms / 1000)
        except asyncio.TimeoutError:  # the model's call goes on in its thread; the client is answered
            message = f"Timed out after {timeout_ms} ms (--rest_api_timeout_in_ms)"
            return 504, json_codec.dumps({"error": message}), "application/json"


_CORS_HEADERS = [(b"access-control-allow-origin", b"*"), (b"access-control-allow-methods", b"POST, GET"),
                 (b"access-control-allow-headers", b"Content-Type")]  # AddCORSHeaders


def _preflight(scope) -> tuple[int, bytes]:
    """RestApiRequestDispatcher's OPTIONS: OK when the Origin header names an http(s) origin."""
    origin = dict(scope.get("headers", [])).get(b"origin", b"")
    if re.search(rb"https?://", origin):
        return 200, b""
    return 400, json_codec.dumps({"error": "Origin header is missing in CORS preflight"})


async def _read_body(receive, limit: int) -> tuple[bytes, bool]:
    chunks, size = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks), size > limit


async def _send(send, status: int, body: bytes, content_type: str, close: bool = False, extra=()) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()), *extra]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _http_protocol(config: ServingConfig):
    """uvicorn's httptools protocol (llhttp, in C) rather than h11's (pure Python): a one-row predict
    costs the server about a third less CPU. It bounds no request head, so the class served is
    serving/http_limits.py's subclass with serving.limits' HTTP limits. Imported here, so a missing
    httptools is said at start instead of in the server's thread."""
    try:
        from serving.http_limits import limited_protocol
    except ImportError as exc:
        raise OSError(f"REST: uvicorn's httptools protocol cannot be imported ({exc}); httptools is in "
                      "requirements.lock (make setup installs it)") from None
    return limited_protocol(config.limits, config.max_request_bytes)


class RestServer:
    """uvicorn in a background thread on an already bound socket (port 0 picks a free port)."""

    def __init__(self, app: RestApp, host: str, port: int):
        import uvicorn

        protocol = _http_protocol(app.config)  # before the socket is bound: nothing to close if it is missing
        self.app = app
        # IPPROTO_TCP named: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on TCP sockets it
        # recognises by their protocol, and a kept-alive answer would otherwise wait ~40 ms for an ACK.
        self.socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM,
                                    socket.IPPROTO_TCP)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind((host, port))
        except OSError as exc:
            self.socket.close()
            raise OSError(f"REST: cannot bind {host}:{port} ({exc.strerror}; set serving.rest_port or --rest-port)") from None
        self.port = self.socket.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", http=protocol,
                                loop="asyncio", timeout_keep_alive=app.config.limits.http_keep_alive_seconds)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, name="rest", daemon=True)

    def start(self, timeout: float = 30.0) -> "RestServer":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise OSError("REST: the HTTP server did not start")
            time.sleep(0.01)
        return self

    def shutdown(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.app.pool.shutdown(wait=False)
        self.socket.close()


def start_rest(manager: ModelManager, metrics: Metrics, config: ServingConfig,
               options: ServerOptions | None = None) -> tuple[RestServer, int]:
    server = RestServer(RestApp(manager, metrics, config, options), config.host, config.rest_port).start()
    return server, server.port
