"""The embedded model server: one process serving TF Serving's gRPC and REST APIs from a serving
root holding models.config and `<model>/<version>/` SavedModels."""
from __future__ import annotations

import logging
import os
import signal
import threading

from serving.config import ServingConfig
from serving.grpc_server import start_grpc
from serving.manager import ModelManager
from serving.metrics import Metrics
from serving.request_log import RequestLog
from serving.rest import start_rest

log = logging.getLogger("loopline.serving")


def configure_tensorflow(config: ServingConfig) -> None:
    """Sizes TensorFlow's thread pools; only possible before TensorFlow runs its first op."""
    import tensorflow as tf

    try:
        if config.inter_op_threads:
            tf.config.threading.set_inter_op_parallelism_threads(config.inter_op_threads)
        if config.intra_op_threads:
            tf.config.threading.set_intra_op_parallelism_threads(config.intra_op_threads)
    except RuntimeError:
        log.warning("TensorFlow already runs in this process; serving.inter_op_threads/intra_op_threads not applied")


class ModelServer:
    def __init__(self, serving_root: str, config: ServingConfig, models_config: str | None = None):
        self.config = config
        self.metrics = Metrics()
        self.manager = ModelManager(serving_root, config, models_config, self.metrics)
        self.request_log = RequestLog(serving_root, self.metrics, config.poll_seconds)
        self.manager.request_log = self.request_log
        self.grpc_port = self.rest_port = None
        self._grpc = self._rest = None

    def start(self) -> "ModelServer":
        configure_tensorflow(self.config)
        self.request_log.start()  # its settings before models.config's logging_config meets them
        self.manager.start()  # loads and warms what models.config names before accepting requests
        try:
            self._grpc, self.grpc_port = start_grpc(self.manager, self.metrics, self.config)
            self._rest, self.rest_port = start_rest(self.manager, self.metrics, self.config)
        except BaseException:  # e.g. a port in use: stop what started, so the process can exit
            self.stop(grace=0)
            raise
        return self

    def stop(self, grace: float = 5.0) -> None:
        self.manager.stop()
        if self._rest:
            self._rest.shutdown()
        if self._grpc:
            self._grpc.stop(grace).wait(grace)
        self.request_log.stop()  # writes what is queued and publishes the open files


def serve_forever(serving_root: str, config: ServingConfig, models_config: str | None = None) -> int:
    """Runs until SIGINT/SIGTERM; prints one line with the bound ports once it is serving."""
    if not os.path.isdir(serving_root):
        raise FileNotFoundError(f"serving root {serving_root} does not exist; run the pipeline (loopline run) first")
    server = ModelServer(serving_root, config, models_config).start()
    scheme = "grpcs" if config.tls_cert else "grpc"
    print(f"loopline serving {serving_root}: {scheme}://{config.host}:{server.grpc_port} "
          f"http://{config.host}:{server.rest_port}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    log.info("stopping: finishing in-flight requests")
    server.stop()
    return 0
