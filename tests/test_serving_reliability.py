"""Breaking the server on purpose: SIGKILL under load then restart, TLS, loopback-only binding."""
from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving.config import ServingConfig
from serving.config_writer import write_serving_configs
from tests.conftest import subprocess_env
from tests.serving_helpers import ServerProcess, add_version, export_model, listening_sockets, wait_for


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    workspace = tmp_path_factory.mktemp("workspace")
    source = export_model(workspace / "export")
    add_version(workspace / "serving" / "penguins", source, 1)
    write_serving_configs(str(workspace / "serving"), ServingConfig())
    return workspace


def request(bill: float = 40.0):
    r = predict_pb2.PredictRequest()
    r.model_spec.name = "penguins"
    r.model_spec.signature_name = "predict_raw"
    r.inputs["bill_length_mm"].CopyFrom(tf.make_tensor_proto([[bill]], tf.float32))
    r.inputs["flipper_length_mm"].CopyFrom(tf.make_tensor_proto([[190.0]], tf.float32))
    r.inputs["island"].CopyFrom(tf.make_tensor_proto([[b"Dream"]]))
    return r


def folder_digest(path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*")) if p.is_file()}


class Traffic:
    """Client threads sending Predicts to the server at `target` until stop(); each client its own
    input, so a mixed-up answer would show. `results`: (bill, scores or the error's code)."""

    def __init__(self, target: str, clients: int = 8):
        self.results: list = []
        self.expected = {35.0 + i: self._scores(target, 35.0 + i) for i in range(clients)}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(target, bill)) for bill in self.expected]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _scores(target: str, bill: float) -> np.ndarray:
        with grpc.insecure_channel(target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            return tf.make_ndarray(stub.Predict(request(bill), timeout=10).outputs["scores"])

    def _client(self, target: str, bill: float) -> None:
        with grpc.insecure_channel(target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            while not self._stop.is_set():
                try:
                    response = stub.Predict(request(bill), timeout=5)
                    self.results.append((bill, tf.make_ndarray(response.outputs["scores"])))
                except grpc.RpcError as exc:
                    self.results.append((bill, exc.code()))
                    time.sleep(0.05)

    def answered_since(self, mark: int) -> int:
        return sum(1 for r in self.results[mark:] if isinstance(r[1], np.ndarray))

    def refused_since(self, mark: int) -> int:
        return len(self.results[mark:]) - self.answered_since(mark)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def check(self) -> set:
        """Every answer is the model's for that client's input; returns the error codes seen."""
        for bill, scores in self.results:
            if isinstance(scores, np.ndarray):
                np.testing.assert_allclose(scores, self.expected[bill], rtol=1e-6)
        return {r[1] for r in self.results if not isinstance(r[1], np.ndarray)}


def test_sigkill_under_load_then_restart(workspace):
    model_folder = workspace / "serving" / "penguins"
    before = folder_digest(model_folder)
    server = ServerProcess(workspace)
    ports = (server.grpc_port, server.rest_port)
    traffic = None
    try:
        traffic = Traffic(server.grpc_target)
        wait_for(lambda: traffic.answered_since(0) > 40, 60, "traffic before the kill")
        server.kill()
        mark = len(traffic.results)
        wait_for(lambda: traffic.refused_since(mark) >= 8, 30, "clients to see the outage")
        server = ServerProcess(workspace, grpc_port=ports[0], rest_port=ports[1])
        mark = len(traffic.results)
        wait_for(lambda: traffic.answered_since(mark) > 40, 90, "traffic after the restart")
    finally:
        if traffic:
            traffic.stop()
        server.stop()
    errors = traffic.check()
    assert errors and errors <= {grpc.StatusCode.UNAVAILABLE}
    assert folder_digest(model_folder) == before


def test_sigterm_under_load_answers_or_refuses_every_call_and_exits(workspace):
    """A stop under load (SIGTERM, as Kubernetes sends): every call before it answered right, the
    process out with 0, later calls refused: UNAVAILABLE, or CANCELLED for a call that
    reached gRPC core as the server shut down and no thread had taken (core cancels those; grpcio's
    stock server does the same)."""
    server = ServerProcess(workspace)
    traffic = None
    try:
        traffic = Traffic(server.grpc_target)
        wait_for(lambda: traffic.answered_since(0) > 40, 60, "traffic before the stop")
        before = len(traffic.results)
        server.proc.terminate()
        assert server.proc.wait(120) == 0  # long enough for a loaded machine: no timing is asserted
        mark = len(traffic.results)
        wait_for(lambda: traffic.refused_since(mark) >= 8, 30, "clients to see the stop")
    finally:
        if traffic:
            traffic.stop()
        server.stop()
    assert all(isinstance(r[1], np.ndarray) for r in traffic.results[:before])
    errors = traffic.check()
    assert grpc.StatusCode.UNAVAILABLE in errors and errors <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
    newest_log = sorted((workspace / "logs").glob("serve-*.log"))[-1]  # the workspace is the module's
    assert "stopping: finishing in-flight requests" in newest_log.read_text()
    assert "stopped: REST" in newest_log.read_text()  # each part of the stop timed in the log


# A process whose main thread waits for the stop signal while the signal goes to another thread:
# Python then flags it there, and only the main thread, once it runs, calls the handler.
SIGNAL_TO_ANOTHER_THREAD = """
import signal, threading, time
from serving.server import wait_for_stop_signal

def send_to_this_thread():
    while signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # until the wait's handler is set
        time.sleep(0.01)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

threading.Thread(target=send_to_this_thread, daemon=True).start()
wait_for_stop_signal()
print("stopped")
"""


def test_a_stop_signal_delivered_to_another_thread_stops_the_wait(tmp_path):
    """The kernel may hand SIGTERM to any of the server's threads (gRPC's, TensorFlow's); the wait
    for it still returns (a wait without a timeout sleeps on until another signal comes)."""
    done = subprocess.run([sys.executable, "-c", SIGNAL_TO_ANOTHER_THREAD], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=subprocess_env())
    assert (done.returncode, done.stdout.strip()) == (0, "stopped"), done.stderr[-2000:]


# A SIGTERM sent the moment the serving line is out: here, from inside the print of that line.
SIGNAL_AT_THE_SERVING_LINE = """
import builtins, signal
from serving import server

class Started:
    grpc_port = rest_port = None
    def start(self): return self
    def addresses(self): return ""
    def stop(self): print("stopped")

server.ModelServer = lambda *args: Started()
print_line = builtins.print
def print_then_signal(*args, **kwargs):
    print_line(*args, **kwargs)
    if str(args[0]).startswith("loopline serving"):
        signal.raise_signal(signal.SIGTERM)
builtins.print = print_then_signal
raise SystemExit(server.serve_forever(None, None))
"""


def test_a_stop_signal_sent_as_the_serving_line_appears_stops_gracefully(tmp_path):
    """A client (a test, a supervisor, a readiness script) may send SIGTERM as soon as it reads
    the serving line; the server must already catch it and stop gracefully, not die of it."""
    done = subprocess.run([sys.executable, "-c", SIGNAL_AT_THE_SERVING_LINE], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=subprocess_env())
    assert (done.returncode, done.stdout.splitlines()[-1:]) == (0, ["stopped"]), done.stderr[-2000:]


def _self_signed(folder):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "server.crt", folder / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_tls_and_loopback_only(workspace, tmp_path):
    cert, key = _self_signed(tmp_path)
    server = ServerProcess(workspace, f"serving.tls_cert={cert}", f"serving.tls_key={key}")
    try:
        assert set(listening_sockets(server.grpc_port).values()) == {"127.0.0.1"}
        assert set(listening_sockets(server.rest_port).values()) == {"127.0.0.1"}
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(server.grpc_target, credentials) as channel:
            response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request(), timeout=20)
            assert tf.make_ndarray(response.outputs["scores"]).shape == (1, 3)
        with grpc.insecure_channel(server.grpc_target) as channel:  # plaintext is refused
            with pytest.raises(grpc.RpcError) as info:
                prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request(), timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop()


def test_busy_port_is_one_line_and_the_process_exits(tmp_path):
    """A port already taken: a one-line error and exit code 1, no traceback, no process left behind."""
    import socket

    (tmp_path / "serving").mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "serve", "--grpc-port", str(port), "--rest-port", "0",
             "--serving-root", str(tmp_path / "serving")],
            capture_output=True, text=True, timeout=120, cwd=tmp_path, env=subprocess_env())
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"loopline: error: gRPC: cannot bind 127.0.0.1:{port}")
    assert "Traceback" not in result.stderr


def test_missing_http_parser_is_one_line_and_the_process_exits(tmp_path):
    """The REST server's HTTP parser (httptools) not importable: said at start in one line, exit 1."""
    hidden = tmp_path / "hidden"
    (hidden / "httptools").mkdir(parents=True)
    (hidden / "httptools" / "__init__.py").write_text('raise ImportError("No module named \'httptools\'")\n')
    (tmp_path / "serving").mkdir()
    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(hidden), env["PYTHONPATH"]])
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "serve", "--grpc-port", "0", "--rest-port", "0",
         "--serving-root", str(tmp_path / "serving")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("loopline: error: REST: uvicorn's httptools protocol cannot be imported")
    assert "requirements.lock" in last and "Traceback" not in result.stderr
