"""Helpers for the serving tests: tiny exported SavedModels and a real server process."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.conftest import REPO, subprocess_env

KINDS = {"bill_length_mm": "float32", "flipper_length_mm": "int64", "island": "string"}
SPECIES = ["Adelie", "Chinstrap", "Gentoo"]


def export_model(path: Path, kind: str = "classification", seed: int = 0, kinds: dict[str, str] | None = None,
                 old_layout: bool = False, default: str | None = None) -> Path:
    """Exports a small untrained tabular model through the trainer's own export path; `kinds`
    overrides feature kinds (a string feature gets a small vocabulary). `old_layout`: as exports
    before the TF Serving signatures were written (one `serving_default` with every head's
    outputs, method predict, and `predict_raw`)."""
    import keras

    from trainer.export import export_saved_model
    from trainer.features import FeatureStats
    from trainer.heads import CLASSIFICATION, REGRESSION, Head
    from trainer.model import ModelContext, build_tabular_model

    keras.utils.set_random_seed(seed)
    kinds = {**KINDS, **(kinds or {})}
    numbers = {"bill_length_mm": (44.0, 5.0), "flipper_length_mm": (200.0, 14.0)}
    strings = {"island": ["Biscoe", "Dream", "Torgersen"]}
    stats = FeatureStats(numbers={k: v for k, v in numbers.items() if kinds[k] != "string"},
                         strings={k: strings.get(k, ["a", "b"]) for k, v in kinds.items() if v == "string"})
    heads = ([Head("species", CLASSIFICATION, vocabulary=SPECIES), Head("body_mass_g", REGRESSION, mean=4200, std=800, label_dtype="float32")]
             if kind == "classification" else [Head("body_mass_g", REGRESSION, mean=4200, std=800, label_dtype="float32")])
    model = build_tabular_model(ModelContext(kinds, stats, heads), hidden_units=(8,))
    if old_layout:
        export_old_layout(model, kinds, heads, str(path))
    else:
        export_saved_model(model, kinds, heads, str(path), default)
    return path


def export_old_layout(model, kinds, heads, export_dir: str) -> None:
    """The layout-1 export (no `layout` in loopline_signature.json)."""
    import json

    import keras
    import tensorflow as tf

    from trainer.export import named_outputs, raw_input_spec
    from trainer.features import parse_examples

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", lambda inputs: named_outputs(heads, model(parse_examples(inputs, kinds), training=False)),
                         input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    archive.add_endpoint("predict_raw", lambda features: named_outputs(heads, model(features, training=False)),
                         input_signature=[raw_input_spec(kinds)])
    archive.write_out(export_dir, verbose=False)
    assets = Path(export_dir) / "assets.extra"
    assets.mkdir(parents=True, exist_ok=True)
    (assets / "loopline_signature.json").write_text(json.dumps({"features": kinds, "heads": [h.to_json() for h in heads]}))


def example(bill: float = 40.0, flipper: int = 190, island: str = "Dream"):
    from tensorflow.core.example import example_pb2

    e = example_pb2.Example()
    e.features.feature["bill_length_mm"].float_list.value.append(bill)
    e.features.feature["flipper_length_mm"].int64_list.value.append(flipper)
    e.features.feature["island"].bytes_list.value.append(island.encode())
    return e


def add_version(base: Path, source: Path, version: int) -> Path:
    """Copies a SavedModel in as a new version, renamed into place in one step (as a pusher should)."""
    staging = base / f".staging-{version}"
    shutil.copytree(source, staging)
    os.replace(staging, base / str(version))
    return base / str(version)


class ServerProcess:
    """`loopline serve` in a child process on free ports; always stopped by `stop()`."""

    def __init__(self, workspace: Path, *overrides: str, grpc_port: int = 0, rest_port: int = 0, timeout: float = 90.0):
        self.workspace = workspace
        self.log_path = workspace / f"server-{time.time_ns()}.log"
        args = [sys.executable, "-m", "pipeline.cli", "serve", "--config", str(REPO / "loopline.yaml"),
                "--set", f"pipeline.root={workspace}", "--grpc-port", str(grpc_port), "--rest-port", str(rest_port),
                "--set", "serving.poll_seconds=0.3", *[a for o in overrides for a in ("--set", o)]]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     env=subprocess_env(), cwd=REPO)
        self.grpc_port = self.rest_port = None
        line = self._read_line(timeout)
        if "loopline serving" not in line:
            self.stop()
            raise RuntimeError(f"server did not start: {line!r}\n{self.log()}")
        grpc_part, http_part = line.split()[-2:]
        self.grpc_port = int(grpc_part.rsplit(":", 1)[1])
        self.rest_port = int(http_part.rsplit(":", 1)[1])

    def _read_line(self, timeout: float) -> str:
        result = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        return result[0] if result else ""

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def log(self) -> str:
        """What the server wrote to its terminal (standard error)."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def command_log(self) -> str:
        """The server's command log (`<pipeline.root>/logs/serve-*.log`): everything, TensorFlow's lines included."""
        found = sorted((self.workspace / "logs").glob("serve-*.log"))
        assert len(found) == 1, found
        return found[0].read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


def predict_examples(workspace: Path, model_name: str, records: list[bytes], input_name: str = "examples"):
    """One gRPC Predict of serialized tf.Examples (the default signature) to a `loopline serve`
    started on `workspace` for it; the PredictResponse."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = "serving_default"
    request.inputs[input_name].CopyFrom(tf.make_tensor_proto(records))
    server = ServerProcess(workspace)
    try:
        with grpc.insecure_channel(server.grpc_target) as channel:
            return prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)
    finally:
        server.stop()


def child_pids(pid: int) -> list[int]:
    """The processes `pid` started (Linux /proc); a supervised server is its supervisor's child."""
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(p) for p in children.read_text().split()]
        except OSError:  # the thread ended meanwhile
            continue
    return found


def running(pid: int) -> bool:
    """Alive and not a zombie waiting for its parent to read its status."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def listening_sockets(port: int) -> dict[str, str]:
    """{`socket:[inode]`: local address} of each TCP socket listening on `port` (/proc/net/tcp{,6})."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            columns = row.split()
            address, hex_port = columns[1].split(":")
            if columns[3] == "0A" and int(hex_port, 16) == port:
                found[f"socket:[{columns[9]}]"] = _address(bytes.fromhex(address))
    return found


def _address(raw: bytes) -> str:
    """An address as /proc/net/tcp writes it (32-bit words in host order), as text."""
    import ipaddress

    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    v6 = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return str(v6.ipv4_mapped or v6)  # ::ffff:127.0.0.1 is still loopback


def tree_rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """Resident memory of a process and its descendants (a supervised server runs in a child);
    `field` VmHWM: each one's peak instead."""
    total = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            total += int(line.split()[1]) * 1024
    for child in child_pids(pid):
        total += tree_rss_bytes(child, field)
    return total


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class TfServingServer:
    """`loopline serve` started as TF Serving's test harness starts `tensorflow_model_server`
    (tensorflow_model_server_test_base.py, RunServer): free ports from portpicker, REST on, a 5 s
    REST timeout, a gRPC Unix socket, `grpc.so_reuseaddr=1` added to the channel arguments, then
    the model flags. One flag is ours: `--set serving.host=127.0.0.1`, as tests stay on loopback
    (TF Serving's flags alone bind all interfaces). `wait` waits as WaitForServerReady does."""

    def __init__(self, tmp: Path, *flags: str, model_name: str | None = None, model_path: Path | None = None,
                 model_config_file: Path | None = None, grpc_channel_arguments: str = "", wait: bool = True,
                 timeout: float = 120.0):
        import portpicker

        self.port, self.rest_port = portpicker.pick_unused_port(), portpicker.pick_unused_port()
        self.socket_path = tmp / "tf-serving.sock"
        command = [f"--port={self.port}", f"--rest_api_port={self.rest_port}", "--rest_api_timeout_in_ms=5000",
                   f"--grpc_socket_path={self.socket_path}"]
        if model_config_file:
            command.append(f"--model_config_file={model_config_file}")
        else:
            command += [f"--model_name={model_name}", f"--model_base_path={model_path}"]
        channel_arguments = ",".join(a for a in (grpc_channel_arguments, "grpc.so_reuseaddr=1") if a)
        command += [*flags, f"--grpc_channel_arguments={channel_arguments}"]
        self.command = command
        self.log_path = tmp / f"server-{time.time_ns()}.log"
        self.out_path = tmp / f"server-{time.time_ns()}.out"
        with open(self.log_path, "w") as err, open(self.out_path, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "serve", *command,
                                          "--set", "serving.host=127.0.0.1"], stdout=out, stderr=err,
                                         env=subprocess_env(), cwd=REPO)
        if wait:
            self.wait_until_ready(timeout)

    @property
    def grpc_address(self) -> str:
        return f"localhost:{self.port}"

    @property
    def rest_url(self) -> str:
        return f"http://localhost:{self.rest_port}"

    def wait_until_ready(self, timeout: float) -> None:
        """WaitForServerReady: a Predict for a missing model until the answer names a Servable."""
        import grpc
        from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

        request = predict_pb2.PredictRequest()
        request.model_spec.name = "intentionally_missing_model"
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.grpc_address) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
                try:
                    stub.Predict(request, timeout=5)
                except grpc.RpcError as error:
                    if "Servable" in (error.details() or ""):
                        return
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.log()}")

    def stdout(self) -> str:
        return self.out_path.read_text()

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        """As the harness (atexit.register(proc.kill)): killed, nothing about stopping is tested here."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
