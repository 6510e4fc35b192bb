"""The embedded model server: one process serving TF Serving's gRPC and REST APIs, from a serving
root holding models.config and `<model>/<version>/` SavedModels (`loopline serve`), or from TF
Serving's command line (serving.tf_serving_flags)."""
from __future__ import annotations

import logging
import os
import signal
import time

from serving import supervisor
from serving.config import ServingConfig
from serving.grpc_server import start_grpc
from serving.load_journal import LoadJournal
from serving.manager import ModelManager
from serving.metrics import Metrics
from serving.options import ServerOptions
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
    def __init__(self, serving_root: str | None, config: ServingConfig, models_config: str | None = None,
                 options: ServerOptions | None = None):
        self.config = config
        self.metrics = Metrics(server_restarts=supervisor.restarts_so_far())
        self.manager = ModelManager(serving_root, config, models_config, self.metrics, options)
        self.manager.load_journal = LoadJournal.from_environment()
        self.options = self.manager.options
        config_dir = os.path.dirname(self.options.models_config) if self.options.models_config else None
        self.request_log = RequestLog(config_dir, self.metrics, self.options.config_poll_seconds,
                                      self.options.saved_model_tags)
        self.manager.request_log = self.request_log
        self.grpc_port = self.rest_port = None
        self._grpc = self._rest = None

    def start(self) -> "ModelServer":
        configure_tensorflow(self.config)
        self.request_log.start()  # its settings before models.config's logging_config meets them
        try:
            self.manager.start()  # loads and warms what the config names before accepting requests
            if self.options.tf_serving_rules:
                self._wait_for_versions()
            self._bind_where_the_last_server_did()
            if self.options.grpc_tcp or self.options.grpc_socket_path:
                self._grpc, self.grpc_port = start_grpc(self.manager, self.metrics, self.config, self.options)
            if self.options.rest_enabled:
                self._rest, self.rest_port = start_rest(self.manager, self.metrics, self.config, self.options)
        except BaseException:  # a model that does not load, a port in use: stop what started
            self.stop(grace=0)
            raise
        return self

    def _bind_where_the_last_server_did(self) -> None:
        """A restarted server (serving.supervisor) takes the ports its predecessor had, which port 0
        in the command line would not give again: clients reconnect to the same address."""
        grpc_port, rest_port = supervisor.remembered_ports()
        if grpc_port is not None:
            self.config.grpc_port = grpc_port
        if rest_port is not None:
            self.config.rest_port = rest_port

    def _wait_for_versions(self) -> None:
        """As TF Serving's start-up, wait until every model has a version loaded or refused."""
        waiting, told = self.manager.models_without_versions(), False
        while waiting:
            if not told:
                log.warning("waiting for a version of %s (no numbered folder under its base path yet)", waiting)
                told = True
            time.sleep(max(self.options.version_poll_seconds, 0.2))
            waiting = self.manager.models_without_versions()

    def stop(self, grace: float = 5.0) -> None:
        took = {}  # seconds per part: a slow stop says which part held it
        started = time.monotonic()
        self.manager.stop()
        if self._rest:
            self._rest.shutdown()
            took["REST"], started = time.monotonic() - started, time.monotonic()
        if self._grpc:
            self._grpc.stop(grace).wait(grace)
            took["gRPC"], started = time.monotonic() - started, time.monotonic()
        self.request_log.stop()  # writes what is queued and publishes the open files
        took["request log"] = time.monotonic() - started
        log.info("stopped: %s", ", ".join(f"{part} {seconds:.1f} s" for part, seconds in took.items()))

    def addresses(self) -> str:
        """Where it serves, for the line printed once it is serving."""
        scheme = "grpcs" if self.config.tls_cert else "grpc"
        parts = []
        if self.grpc_port is not None:
            parts.append(f"{scheme}://{self.config.host}:{self.grpc_port}")
        if self.options.grpc_socket_path:
            parts.append(f"{scheme}://unix:{self.options.grpc_socket_path}")
        if self.rest_port is not None:
            parts.append(f"http://{self.config.host}:{self.rest_port}")
        return " ".join(parts)


# Python runs a signal's handler in the main thread, and only once that thread runs. The kernel
# may hand SIGTERM to any thread of the process (gRPC's, TensorFlow's); a main thread asleep in a
# wait without a timeout then sleeps through it, until another signal. Waking every half second
# bounds the delay.
STOP_SIGNAL_POLL_S = 0.5


class StopSignals:
    """Remembers SIGINT and SIGTERM from the moment it is made, whichever thread they reach."""

    def __init__(self):
        # The handler only appends: a handler that took a lock (Event.set) could find it held by
        # the very code it interrupted, and wait on itself.
        self.received: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, _frame: self.received.append(signum))

    def wait(self) -> None:
        """Returns once one has arrived (at once if one already had)."""
        while not self.received:
            time.sleep(STOP_SIGNAL_POLL_S)


def wait_for_stop_signal() -> None:
    """Returns once SIGINT or SIGTERM has arrived, whichever thread it was delivered to."""
    StopSignals().wait()


def serve_forever(serving_root: str | None, config: ServingConfig, models_config: str | None = None,
                  options: ServerOptions | None = None, banner: str = "") -> int:
    """Runs until SIGINT/SIGTERM; prints one line with the bound addresses once it is serving."""
    server = ModelServer(serving_root, config, models_config, options).start()
    # Caught from before the line that says it is serving: a SIGTERM sent as soon as that line is
    # read must stop it gracefully, not find the default action (death by the signal) still set.
    stop = StopSignals()
    supervisor.remember_ports(server.grpc_port, server.rest_port)
    print(f"loopline serving {banner or serving_root}: {server.addresses()}", flush=True)
    stop.wait()
    log.info("stopping: finishing in-flight requests")
    server.stop()
    return 0
