"""TF Serving's command line (serving.tf_serving_flags): TensorFlow's flag parsing rules, the flags
implemented, warned and refused, BuildAndStart's checks, what the flags become, and the
`tensorflow_model_server` command, and in one in-process server the front-end flags TF Serving's
own cases (test_tf_serving_model_server.py) do not reach."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import main
from serving import tf_serving_flags as flags
from serving.config import ServingConfig
from tests.conftest import REPO, subprocess_env

DATA = REPO / "tests" / "data" / "tf_serving"


def test_flags_are_tf_servings_with_its_defaults():
    """main.cc's 48 flags in its order, with server.h's defaults for those the issue names."""
    assert len(flags.FLAGS) == 48 and flags.FLAGS[0].name == "port"
    v = flags.parse([]).values
    assert (v["port"], v["rest_api_port"], v["model_name"], v["model_base_path"]) == (8500, 0, "default", "")
    assert (v["model_config_file_poll_wait_seconds"], v["file_system_poll_wait_seconds"], v["rest_api_timeout_in_ms"]) == (0, 1, 30000)
    assert (v["enable_batching"], v["enable_model_warmup"], v["num_request_iterations_for_warmup"]) == (False, True, 0)
    assert (v["saved_model_tags"], v["enable_signature_method_name_check"]) == ("serve", False)


def test_parsing_follows_tensorflows_rules():
    parsed = flags.parse(["--port=9000", "--enable_batching", "--enable_model_warmup=FALSE", "--rest_api_enable_cors_support=1",
                          "--allow_version_labels_for_unavailable_models=0", "--port=9001", "--port", "8502",
                          "-model_name=x", "--model_name_x=y", "--", "--rest_api_port=1"])
    v = parsed.values
    assert v["port"] == 9001  # the last repeat wins
    assert (v["enable_batching"], v["enable_model_warmup"], v["rest_api_enable_cors_support"]) == (True, False, True)
    assert v["allow_version_labels_for_unavailable_models"] is False and v["rest_api_port"] == 0
    # `--port` without `=` is no flag (only a boolean stands alone); one dash, another name, and all after `--` neither.
    assert parsed.unknown == ["--port", "8502", "-model_name=x", "--model_name_x=y", "--", "--rest_api_port=1"]
    assert parsed.errors == []
    bad = flags.parse(["--port=85OO", "--enable_batching=yes", "--rest_api_timeout_in_ms=99999999999", "--port= 7"])
    assert bad.errors == ["Couldn't interpret value 85OO for flag port.", "Couldn't interpret value yes for flag enable_batching.",
                          "Couldn't interpret value 99999999999 for flag rest_api_timeout_in_ms."]
    assert bad.values["port"] == 7  # sscanf("%d") skips leading spaces


def test_a_bad_value_stops_and_an_unknown_argument_is_reported(capsys, tmp_path):
    assert main(["serve", "--port=eighty"]) == 255
    assert capsys.readouterr().err.splitlines()[0] == "Couldn't interpret value eighty for flag port."
    # An unknown argument is reported and start-up goes on, here to BuildAndStart's first check.
    assert main(["serve", "--port=0", "--model_base_path=/m", "--bogus=1", "--other"]) == 255
    err = capsys.readouterr().err.splitlines()
    assert err == ["unknown argument: --bogus=1", "Failed to start server. Error: INVALID_ARGUMENT: At least one of "
                   "server_options.grpc_port or server_options.grpc_socket_path must be set."]


@pytest.mark.parametrize("argv, message", [
    (["--model_name=m"], "Both server_options.model_base_path and server_options.model_config_file are empty!"),
    (["--model_base_path=/m", f"--batching_parameters_file={DATA / 'batching_config.txt'}"],
     "server_options.batching_parameters_file is set without setting server_options.enable_batching to true."),
    (["--model_base_path=/m", "--tensorflow_intra_op_parallelism=2", "--tensorflow_inter_op_parallelism=2",
      "--tensorflow_session_parallelism=2"], "Either configure server_options.tensorflow_session_parallelism or "
     "(server_options.tensorflow_intra_op_parallelism, server_options.tensorflow_inter_op_parallelism) separately. "
     "You cannot configure all."),
])
def test_build_and_start_checks(capsys, argv, message):
    assert main(["serve", *argv]) == 255
    assert capsys.readouterr().err.strip() == f"Failed to start server. Error: INVALID_ARGUMENT: {message}"


@pytest.mark.parametrize("flag", ["--ssl_config_file=/etc/ssl.config", "--use_alts_credentials",
                                  "--platform_config_file=/etc/platform.config"])
def test_refused_flags_stop_with_one_line(capsys, flag):
    assert main(["serve", "--model_base_path=/m", flag]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"loopline serve: {flag.split('=')[0]} is refused: ") and len(err.splitlines()) == 1


def test_warned_flags_say_what_is_not_done_only_when_it_matters():
    def warnings(*argv):
        return flags.warnings_and_refusals(flags.parse(list(argv)))

    assert warnings("--num_load_threads=4") == [
        "loopline serve: --num_load_threads=4 accepted but not applied: versions load one at a time"]
    assert warnings("--num_load_threads=0", "--prefer_tflite_model=false", "--ssl_config_file=") == []  # TF Serving's defaults
    assert warnings("--enable_profiler=false") == [] and len(warnings("--enable_profiler")) == 1
    assert warnings("--port=1", "--rest_api_port=1") == [  # TF Serving's own error line; REST is skipped
        "server_options.http_port cannot be same as grpc_port. Please use a different port for HTTP/REST API. "
        "Skipped exporting HTTP/REST API."]
    assert flags.server_options(flags.parse(["--port=1", "--rest_api_port=1", "--model_base_path=/m"]).values).rest_enabled is False
    every = {f.handling for f in flags.FLAGS}
    assert every == {flags.IMPLEMENTED, flags.WARNED, flags.REFUSED}
    assert all(f.note for f in flags.FLAGS if f.handling != flags.IMPLEMENTED)


def test_what_the_flags_become():
    v = flags.parse(["--port=0", "--grpc_socket_path=/tmp/s", "--rest_api_port=9001", "--model_name=m", "--model_base_path=/models/m",
                     "--enable_batching", f"--batching_parameters_file={DATA / 'batching_config.txt'}",
                     "--tensorflow_session_parallelism=3", "--grpc_max_threads=7", "--rest_api_num_threads=5",
                     "--grpc_channel_arguments=grpc.max_connection_age_ms=2000,grpc.lb_policy_name=grpclb",
                     f"--monitoring_config_file={DATA / 'monitoring_config.txt'}", "--saved_model_tags=serve,gpu",
                     "--num_request_iterations_for_warmup=3", "--enable_signature_method_name_check"]).values
    config = flags.serving_config(v, ServingConfig())
    assert config.host == "0.0.0.0" and config.max_request_bytes == 2**31 - 1  # TF Serving's binding and gRPC limit
    assert (config.intra_op_threads, config.inter_op_threads) == (3, 3)  # session parallelism sets both
    assert (config.grpc_workers, config.rest_port, config.signature_method_name_check) == (7, 9001, True)
    b = config.batching  # batching_config.txt: 128 rows, no timeout, 1000000 batches queued, 8 threads
    assert (b.enabled, b.max_batch_size, b.batch_timeout_micros, b.max_enqueued_batches, b.num_batch_threads) == (True, 128, 0, 1000000, 8)
    options = flags.server_options(v)
    assert options.grpc_tcp is False and options.grpc_socket_path == "/tmp/s" and options.rest_threads == 5
    assert options.grpc_channel_arguments == [("grpc.max_connection_age_ms", 2000), ("grpc.lb_policy_name", "grpclb")]
    assert options.prometheus_path == "/monitoring/prometheus/metrics" and options.saved_model_tags == ("serve", "gpu")
    assert options.warmup_iterations == 3 and options.tf_serving_rules and options.config_poll_seconds == 0
    (entry,) = options.model_config.model_config_list.config  # BuildSingleModelConfig
    assert (entry.name, entry.base_path, entry.model_platform) == ("m", "/models/m", "tensorflow")
    # Keys a loopline config sets explicitly win over TF Serving's binding and limit.
    mine = flags.serving_config(v, ServingConfig(host="127.0.0.1", max_request_bytes=4096))
    assert (mine.host, mine.max_request_bytes) == ("127.0.0.1", 4096)
    assert flags.banner("tensorflow_model_server", "0.0.0.0") == \
        "as tensorflow_model_server on all interfaces (0.0.0.0, as TF Serving binds)"


def test_loopline_flags_do_not_mix_with_tf_servings(capsys):
    assert main(["serve", "--grpc-port", "9000", "--model_base_path=/m"]) == 2
    assert "--grpc-port: loopline's own flags do not mix with TF Serving's" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # no TF Serving flag among them: argparse's own error, as before
        main(["serve", "--grpc_port=9000"])


def test_tensorflow_model_server_command():
    """The console script pyproject declares, under the binary's name (make setup installs it)."""
    command = shutil.which("tensorflow_model_server", path=str(Path(sys.executable).parent))
    assert command, "tensorflow_model_server is not installed beside this Python (make setup)"
    result = subprocess.run([command, "--version", "--bogus"], capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("TensorFlow ModelServer: loopline ")
    assert "TensorFlow Library: 2." in result.stdout
    result = subprocess.run([command, "--help"], capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert result.returncode == 255 and result.stdout.startswith("usage: tensorflow_model_server\nFlags:\n")
    assert "\t--ssl_config_file=\"\"" in result.stdout and "refused: " in result.stdout


def _spinning_model(path: Path) -> None:
    """`count` counts to its input `n` in a graph loop: as slow as the request asks."""
    import tensorflow as tf

    class Spin(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([], tf.int64, name="n")])
        def count(self, n):
            return {"count": tf.while_loop(lambda i: i < n, lambda i: (i + 1,), [tf.constant(0, tf.int64)])[0]}

    module = Spin()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.count})


def test_front_end_flags_no_ported_case_covers(tmp_path):
    """In process, on loopback: gRPC on the Unix socket only (--port=0), answers as tensor_content
    (--enable_serialization_as_tensor_content), the health service, CORS, the REST timeout (504,
    and the server serves on), no metrics page without a monitoring config."""
    import grpc
    import requests
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from serving.server import ModelServer

    _spinning_model(tmp_path / "spin" / "1")
    v = flags.parse(["--port=0", f"--grpc_socket_path={tmp_path / 'grpc.sock'}", "--rest_api_port=1", "--model_name=spin",
                     f"--model_base_path={tmp_path / 'spin'}", "--rest_api_timeout_in_ms=300", "--rest_api_enable_cors_support",
                     "--enable_serialization_as_tensor_content", "--enable_grpc_healthcheck_service"]).values
    config = flags.serving_config(v, ServingConfig(host="127.0.0.1")).model_copy(update={"rest_port": 0})  # any free port
    server = ModelServer(None, config, options=flags.server_options(v)).start()
    try:
        assert server.grpc_port is None
        channel = grpc.insecure_channel(f"unix:{tmp_path / 'grpc.sock'}")
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "spin"
        request.inputs["n"].CopyFrom(tf.make_tensor_proto(5, tf.int64))
        answer = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30).outputs["count"]
        assert answer.tensor_content and not answer.int64_val and tf.make_ndarray(answer) == 5

        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        assert check(b"", timeout=10) == b"\x08\x01"  # HealthCheckResponse{status: SERVING}
        assert check(b"\n\x11PredictionService", timeout=10) == b"\x08\x01"
        with pytest.raises(grpc.RpcError) as info:
            check(b"\n\x04nope", timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        channel.close()

        url = f"http://127.0.0.1:{server.rest_port}"
        preflight = requests.options(f"{url}/v1/models/spin:predict", headers={"Origin": "https://app.example"}, timeout=10)
        assert preflight.status_code == 200 and preflight.headers["Access-Control-Allow-Origin"] == "*"
        assert requests.options(f"{url}/v1/models/spin:predict", timeout=10).status_code == 400
        slow = requests.post(f"{url}/v1/models/spin:predict", json={"inputs": 3_000_000}, timeout=60)
        assert slow.status_code == 504 and "--rest_api_timeout_in_ms" in slow.json()["error"]
        quick = requests.post(f"{url}/v1/models/spin:predict", json={"inputs": 3}, timeout=60)
        assert quick.json() == {"outputs": 3} and quick.headers["Access-Control-Allow-Methods"] == "POST, GET"
        assert requests.get(f"{url}/monitoring/prometheus/metrics", timeout=10).status_code == 404
    finally:
        server.stop(grace=0)


def test_the_docs_list_every_flag_as_it_is_handled():
    """docs/serving.md's flag table says of each flag what serving.tf_serving_flags does with it."""
    import re

    text = (REPO / "docs" / "serving.md").read_text()
    rows = dict(re.findall(r"^\| `--([a-z0-9_]+)` \| [^|]* \| (implemented|warning|refused)", text, re.M))
    word = {flags.IMPLEMENTED: "implemented", flags.WARNED: "warning", flags.REFUSED: "refused"}
    assert rows == {f.name: word[f.handling] for f in flags.FLAGS}
