"""gRPC front end: TF Serving's PredictionService and ModelService on the stock service stubs."""
from __future__ import annotations

import logging
import time

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc, prediction_service_pb2_grpc

from serving import request_ids, service
from serving.config import ServingConfig
from serving.errors import ServingError
from serving.grpc_transport import InlineServer, make_server
from serving.manager import ModelManager
from serving.metrics import Metrics
from serving.options import ServerOptions

log = logging.getLogger("loopline.serving")


ERROR_MESSAGE_LIMIT = 1024  # grpc_status_util.cc's kErrorMessageLimit


def grpc_message(message: str) -> str:
    """ToGRPCStatus: a message over 1024 characters is cut there and marked."""
    return message if len(message) <= ERROR_MESSAGE_LIMIT else message[:ERROR_MESSAGE_LIMIT] + "...TRUNCATED"


def _handler(method: str, work):
    def call(self, request, context):
        started = time.perf_counter()
        code = "OK"
        try:
            # The client's x-request-id (or a new one), returned in the trailing metadata.
            context.set_trailing_metadata(((request_ids.HEADER, request_ids.from_grpc(context)),))
            return work(self.manager, request)
        except ServingError as exc:
            code = exc.code.name
            context.abort(exc.code, grpc_message(exc.message))
        except Exception as exc:  # noqa: BLE001 - a bug must answer INTERNAL, not kill the server
            if isinstance(exc, grpc.RpcError) or type(exc).__name__ == "_AbortError":
                raise  # context.abort's own exception
            code = "INTERNAL"
            log.exception("%s failed", method)
            context.abort(grpc.StatusCode.INTERNAL, f"{method}: {type(exc).__name__}: {exc}")
        finally:
            self.metrics.observe("grpc", getattr(getattr(request, "model_spec", None), "name", ""), method, code,
                                 time.perf_counter() - started)
    call.__name__ = method
    return call


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, manager: ModelManager, metrics: Metrics):
        self.manager, self.metrics = manager, metrics

    Predict = _handler("Predict", service.predict)
    Classify = _handler("Classify", service.classify)
    Regress = _handler("Regress", service.regress)
    MultiInference = _handler("MultiInference", service.multi_inference)
    GetModelMetadata = _handler("GetModelMetadata", service.metadata)


def _reload(manager: ModelManager, request):
    manager.apply_config(request.config, from_network=True)
    return model_management_pb2.ReloadConfigResponse(status={"error_code": 0})  # OK; errors are the RPC's status


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, manager: ModelManager, metrics: Metrics):
        self.manager, self.metrics = manager, metrics

    GetModelStatus = _handler("GetModelStatus", service.model_status)
    HandleReloadConfigRequest = _handler("HandleReloadConfigRequest", _reload)


def _health_service() -> grpc.GenericRpcHandler:
    """The standard gRPC health service's Check (grpc.health.v1), as --enable_grpc_healthcheck_service
    turns it on: "" (the server), "ModelService" and "PredictionService" answer SERVING (the names
    TF Serving sets), any other NOT_FOUND. Watch is not served."""
    request_class, response_class = _health_messages()

    def check(request, context):
        if request.service not in ("", "ModelService", "PredictionService"):
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return response_class(status=1)  # HealthCheckResponse.SERVING

    handler = grpc.unary_unary_rpc_method_handler(check, request_deserializer=request_class.FromString,
                                                  response_serializer=response_class.SerializeToString)
    return grpc.method_handlers_generic_handler("grpc.health.v1.Health", {"Check": handler})


def _health_messages():
    """HealthCheckRequest and HealthCheckResponse (grpc/health/v1/health.proto: a string, an enum),
    declared here with their field numbers: the health-checking package is not in the lock."""
    pool = descriptor_pool.DescriptorPool()
    f = descriptor_pb2.FileDescriptorProto(name="loopline_grpc_health.proto", package="grpc.health.v1", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto
    f.message_type.add(name="HealthCheckRequest").field.add(name="service", number=1, type=T.TYPE_STRING,
                                                            label=T.LABEL_OPTIONAL)
    f.message_type.add(name="HealthCheckResponse").field.add(name="status", number=1, type=T.TYPE_INT32,
                                                             label=T.LABEL_OPTIONAL)  # an enum on the wire
    pool.Add(f)
    get = lambda name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"grpc.health.v1.{name}"))
    return get("HealthCheckRequest"), get("HealthCheckResponse")


def _server_options(config: ServingConfig, options: ServerOptions) -> list[tuple[str, int | str]]:
    """gRPC channel arguments: the command line's (--grpc_channel_arguments), then the message size
    limits, which win as TF Serving's SetMaxMessageSize does."""
    limit = options.grpc_max_message_bytes or config.max_request_bytes
    sizes = {"grpc.max_receive_message_length": limit,
             "grpc.max_send_message_length": max(limit, 64 * 1024 * 1024) if options.grpc_max_message_bytes is None
             else limit}
    merged = {"grpc.so_reuseport": 0, **dict(options.grpc_channel_arguments), **sizes}
    return list(merged.items())


def start_grpc(manager: ModelManager, metrics: Metrics, config: ServingConfig,
               options: ServerOptions | None = None) -> tuple[InlineServer | grpc.Server, int | None]:
    """Starts the server on config.host:config.grpc_port (0 picks a free port) unless
    options.grpc_tcp is off, and on options.grpc_socket_path when set; returns it and the TCP port."""
    options = options or ServerOptions()
    server = make_server(config.grpc_workers, _server_options(config, options))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionServicer(manager, metrics), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(manager, metrics), server)
    if options.grpc_health_check:
        server.add_generic_rpc_handlers((_health_service(),))
    port = None
    if options.grpc_tcp:
        port = _bind(server, f"{config.host}:{config.grpc_port}", config)
    if options.grpc_socket_path:
        _bind(server, f"unix:{options.grpc_socket_path}", config)
    server.start()
    return server, port


def _bind(server: InlineServer | grpc.Server, address: str, config: ServingConfig) -> int:
    try:
        if config.tls_cert:
            with open(config.tls_key, "rb") as k, open(config.tls_cert, "rb") as c:
                credentials = grpc.ssl_server_credentials([(k.read(), c.read())])
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError:  # grpc's "Failed to bind": in use, or not an address of this machine
        port = 0
    if port == 0:
        raise OSError(f"gRPC: cannot bind {address} (in use? set serving.grpc_port or --grpc-port / --port)")
    return port
