"""Containment: a crash in the model's own code (here TensorFlow's Abort op, which kills the process
with SIGABRT, as a bad kernel or custom op would) does not leave `loopline serve` down. The
supervisor (serving/supervisor.py) starts the server again on the same ports; a version whose
warmup crashed the process is refused while the other versions serve."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from tensorflow_serving.apis import (get_model_status_pb2, model_service_pb2_grpc, predict_pb2, prediction_log_pb2,
                                     prediction_service_pb2_grpc)

from serving.config import ServingConfig
from serving.config_writer import write_serving_configs
from tests.conftest import REPO, subprocess_env
from tests.serving_helpers import ServerProcess, add_version, child_pids, running, wait_for

FAST_RESTARTS = ("serving.restart_delay_seconds=0.1",)


class Doubler(tf.Module):
    """`serving_default` doubles x; `crash` runs TensorFlow's Abort op first, which kills the process."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def double(self, x):
        return {"y": x * 2.0}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def crash(self, x):
        abort = tf.raw_ops.Abort(error_msg="the model's own abort")
        with tf.control_dependencies([abort]):  # Abort has no output: only a dependency makes it run
            return {"y": tf.identity(x * 2.0)}


def predict_request(model: str, signature: str = "serving_default", version: int | None = None):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    request.inputs["x"].CopyFrom(tf.make_tensor_proto([1.5], tf.float32))
    return request


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """`plain`: the Doubler; `crashes_in_warmup`: the same with a warmup record that calls `crash`."""
    base = tmp_path_factory.mktemp("exports")
    module = Doubler()
    tf.saved_model.save(module, str(base / "plain"), signatures={"serving_default": module.double,
                                                                 "crash": module.crash})
    shutil.copytree(base / "plain", base / "crashes_in_warmup")
    (base / "crashes_in_warmup" / "assets.extra").mkdir()
    record = prediction_log_pb2.PredictionLog()
    record.predict_log.request.CopyFrom(predict_request("doubler", "crash"))
    with tf.io.TFRecordWriter(str(base / "crashes_in_warmup" / "assets.extra" / "tf_serving_warmup_requests")) as w:
        w.write(record.SerializeToString())
    return {"plain": base / "plain", "crashes_in_warmup": base / "crashes_in_warmup"}


def serving_root(workspace: Path, versions: dict[int, Path]) -> Path:
    """`<workspace>/serving` with model `doubler` at the given versions (latest policy: one served)."""
    root = workspace / "serving"
    for version, export in versions.items():
        add_version(root / "doubler", export, version)
    write_serving_configs(str(root), ServingConfig(model_name="doubler"))
    return root


def predict(target: str, request) -> np.ndarray:
    with grpc.insecure_channel(target) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    return tf.make_ndarray(response.outputs["y"])


def restarts_metric(server: ServerProcess) -> str:
    text = requests.get(f"{server.rest_url}/monitoring/prometheus/metrics", timeout=30).text
    return next(line for line in text.splitlines() if line.startswith("loopline_server_restarts_total "))


def test_a_request_that_crashes_the_server_is_contained(tmp_path, exports):
    """The crashing call fails; the supervisor starts the server again on the same ports, says so
    on stdout and in its log, and the next request is answered by the new process."""
    serving_root(tmp_path, {1: exports["plain"]})
    server = ServerProcess(tmp_path, *FAST_RESTARTS)
    try:
        first = child_pids(server.proc.pid)
        assert restarts_metric(server) == "loopline_server_restarts_total 0"
        with pytest.raises(grpc.RpcError) as crashed:
            predict(server.grpc_target, predict_request("doubler", "crash"))
        assert crashed.value.code() == grpc.StatusCode.UNAVAILABLE
        again = server._read_line(120)
        assert again.endswith(f"grpc://127.0.0.1:{server.grpc_port} http://127.0.0.1:{server.rest_port}\n"), again
        np.testing.assert_allclose(predict(server.grpc_target, predict_request("doubler")), [3.0])
        assert restarts_metric(server) == "loopline_server_restarts_total 1"
        assert "server process died of SIGABRT; restart 1 in 0.1 s" in server.log()
        assert child_pids(server.proc.pid) != first and not any(running(pid) for pid in first)
    finally:
        server.stop()


def test_a_version_whose_warmup_crashes_is_refused_and_the_previous_one_serves(tmp_path, exports):
    """Version 2's warmup kills the first server process; the next one refuses version 2 (status
    END, saying why) and serves version 1."""
    serving_root(tmp_path, {1: exports["plain"], 2: exports["crashes_in_warmup"]})
    server = ServerProcess(tmp_path, *FAST_RESTARTS)
    try:
        np.testing.assert_allclose(predict(server.grpc_target, predict_request("doubler")), [3.0])
        with grpc.insecure_channel(server.grpc_target) as channel:
            status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
                get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "doubler"}), timeout=30)
        states = {s.version: (s.state, s.status.error_code, s.status.error_message)
                  for s in status.model_version_status}
        assert states[1][0] == get_model_status_pb2.ModelVersionStatus.AVAILABLE
        assert states[2] == (get_model_status_pb2.ModelVersionStatus.END, grpc.StatusCode.UNKNOWN.value[0],
                             "loading this version crashed the server process (SIGABRT); not loaded again until its "
                             "files change")
        assert restarts_metric(server) == "loopline_server_restarts_total 1"
        assert "model doubler version 2 refused: loading this version crashed" in server.log()
    finally:
        server.stop()


def test_sigterm_to_the_supervisor_stops_its_server_gracefully(tmp_path, exports):
    """And the supervisor itself never loads TensorFlow (its libraries are not mapped in it)."""
    serving_root(tmp_path, {1: exports["plain"]})
    server = ServerProcess(tmp_path)
    try:
        children = child_pids(server.proc.pid)
        assert len(children) == 1
        assert "libtensorflow" in Path(f"/proc/{children[0]}/maps").read_text()
        assert "libtensorflow" not in Path(f"/proc/{server.proc.pid}/maps").read_text()
        server.proc.terminate()
        assert server.proc.wait(120) == 0
        assert not running(children[0])
        assert "stopping: finishing in-flight requests" in server.command_log()
    finally:
        server.stop()


TF_SERVING_MAIN = "import sys; from pipeline.cli import tf_serving_main; sys.exit(tf_serving_main())"


def test_tensorflow_model_server_is_restarted_and_dies_with_its_supervisor(tmp_path, exports):
    """The `tensorflow_model_server` command, gRPC on a Unix socket only (no TCP port): a crash is
    contained there too; a SIGKILL of the supervisor takes its server with it (no orphan)."""
    base = serving_root(tmp_path, {1: exports["plain"]}) / "doubler"
    socket_path = tmp_path / "model-server.sock"
    command = [sys.executable, "-c", TF_SERVING_MAIN, "--port=0", "--rest_api_port=0",
               f"--grpc_socket_path={socket_path}", "--model_name=doubler", f"--model_base_path={base}"]
    with open(tmp_path / "stderr.log", "w") as stderr:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=subprocess_env(),
                                cwd=REPO)
    target = f"unix:{socket_path}"
    try:
        assert "loopline serving" in proc.stdout.readline()
        with pytest.raises(grpc.RpcError):
            predict(target, predict_request("doubler", "crash"))
        assert "loopline serving" in proc.stdout.readline()
        np.testing.assert_allclose(predict(target, predict_request("doubler")), [3.0])
        children = child_pids(proc.pid)
        assert len(children) == 1 and running(children[0])
        proc.kill()
        proc.wait(30)
        wait_for(lambda: not running(children[0]), 30, "the server to die with its supervisor")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert "server process died of SIGABRT; restart 1 in 0.5 s" in (tmp_path / "stderr.log").read_text()


def test_a_server_that_keeps_crashing_at_start_is_given_up(tmp_path, exports):
    """Every version's warmup crashes: after serving.max_rapid_restarts restarts `loopline serve`
    stops with one line saying why, and a non-zero exit."""
    root = serving_root(tmp_path, {1: exports["crashes_in_warmup"], 2: exports["crashes_in_warmup"]})
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "serve", "--serving-root", str(root), "--grpc-port", "0",
         "--rest-port", "0", "--set", "serving.restart_delay_seconds=0.1", "--set", "serving.max_rapid_restarts=1"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=subprocess_env())
    assert done.returncode == 1 and "loopline serving" not in done.stdout
    lines = done.stderr.strip().splitlines()
    assert "server process died of SIGABRT; restart 1 in 0.1 s" in done.stderr
    assert lines[-1] == ("loopline: error: the server process died of SIGABRT; giving up after 1 restart(s) in a row "
                         "(serving.max_rapid_restarts=1)")
