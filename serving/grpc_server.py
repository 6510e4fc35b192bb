"""gRPC front end: TF Serving's PredictionService and ModelService on the stock service stubs."""
from __future__ import annotations

import logging
import time
from concurrent import futures

import grpc
from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc, prediction_service_pb2_grpc

from serving import request_ids, service
from serving.config import ServingConfig
from serving.errors import ServingError
from serving.manager import ModelManager
from serving.metrics import Metrics

log = logging.getLogger("loopline.serving")


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
            context.abort(exc.code, exc.message)
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
    manager.apply_config(request.config)
    return model_management_pb2.ReloadConfigResponse(status={"error_code": 0})  # OK; errors are the RPC's status


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, manager: ModelManager, metrics: Metrics):
        self.manager, self.metrics = manager, metrics

    GetModelStatus = _handler("GetModelStatus", service.model_status)
    HandleReloadConfigRequest = _handler("HandleReloadConfigRequest", _reload)


def start_grpc(manager: ModelManager, metrics: Metrics, config: ServingConfig) -> tuple[grpc.Server, int]:
    """Starts the server on config.host:config.grpc_port (0 picks a free port); returns it and the port."""
    options = [
        ("grpc.max_receive_message_length", config.max_request_bytes),
        ("grpc.max_send_message_length", max(config.max_request_bytes, 64 * 1024 * 1024)),
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=config.grpc_workers, thread_name_prefix="grpc"),
                         options=options, maximum_concurrent_rpcs=config.grpc_workers * 32)
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionServicer(manager, metrics), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(manager, metrics), server)
    address = f"{config.host}:{config.grpc_port}"
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
        raise OSError(f"gRPC: cannot bind {address} (in use? set serving.grpc_port or --grpc-port)")
    server.start()
    return server, port
