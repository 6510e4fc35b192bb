"""Request logging in the embedded server: every API (gRPC and REST) writes TF Serving's
PredictionLog records with their request ids into closed GZIP TFRecord files with a sidecar
index; sampling follows request_log.json and models.config's logging_config on reload; failed
requests and warmup replays are not logged; a full queue or a failing write drops and counts,
never fails a request; files rotate by size and time, old ones go, and all of it works on a
filesystem that is not this machine's disk (ram://)."""
from __future__ import annotations

import json
import threading
import time

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.example import example_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    inference_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_log_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from serving.config import ServingConfig
from serving.config_writer import write_serving_configs
from serving.metrics import Metrics
from serving.model_config import model_config_path, read_model_server_config
from serving.request_log import RequestLog
from serving.request_log_config import RequestLogConfig, write_request_log_file
from serving.request_log_files import (
    INDEX_SUFFIX,
    RECORDS_SUFFIX,
    closed_files,
    delete_older_than,
    read_index,
    read_window,
)
from serving.server import ModelServer
from tests.serving_helpers import add_version, example, export_model, wait_for
from trainer.warmup import write_warmup


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    path = export_model(tmp_path_factory.mktemp("export") / "model")
    write_warmup(str(path), [example().SerializeToString()])  # replayed on load: must not be logged
    return path


def start_server(tmp_path, export, **request_log) -> ModelServer:
    root = tmp_path / "serving"
    add_version(root / "penguins", export, 1)
    write_serving_configs(str(root), ServingConfig())
    write_request_log_file(str(root), RequestLogConfig(**request_log), str(tmp_path / "request_logs"))
    return ModelServer(str(root), ServingConfig(grpc_port=0, rest_port=0, poll_seconds=0.2)).start()


def raw_request(bills: list[float], signature: str = "predict_raw") -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = "penguins", signature
    request.inputs["bill_length_mm"].CopyFrom(tf.make_tensor_proto(np.array([[b] for b in bills], np.float32)))
    request.inputs["flipper_length_mm"].CopyFrom(tf.make_tensor_proto(np.full((len(bills), 1), 200, np.float32)))
    request.inputs["island"].CopyFrom(tf.make_tensor_proto(np.array([[b"Dream"]] * len(bills), dtype=object)))
    return request


def examples_input(message, examples) -> None:
    message.input.example_list.examples.extend(examples)


def send_every_api(server) -> dict[str, str]:
    """One answered request per API and front end, each with its own x-request-id; returns
    {request id: the log_type it must be logged as}."""
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    sent = {}

    def call(method, request, request_id, kind):
        _, rpc = method.with_call(request, metadata=[("x-request-id", request_id)], timeout=30)
        assert dict(rpc.trailing_metadata())["x-request-id"] == request_id  # returned as given
        sent[request_id] = kind

    call(stub.Predict, raw_request([40.0, 50.0]), "grpc-predict-raw", "predict_log")
    by_examples = predict_pb2.PredictRequest()
    by_examples.model_spec.name, by_examples.model_spec.signature_name = "penguins", "predict"
    by_examples.inputs["inputs"].CopyFrom(tf.make_tensor_proto([example().SerializeToString()]))
    call(stub.Predict, by_examples, "grpc-predict-examples", "predict_log")
    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.name = "penguins"
    examples_input(classify, [example(), example(50, 220, "Biscoe")])
    call(stub.Classify, classify, "grpc-classify", "classify_log")
    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name, regress.model_spec.signature_name = "penguins", "regress_body_mass_g"
    examples_input(regress, [example()])
    call(stub.Regress, regress, "grpc-regress", "regress_log")
    multi = inference_pb2.MultiInferenceRequest()
    for signature in ("classify_species", "regress_body_mass_g"):
        multi.tasks.add(model_spec={"name": "penguins", "signature_name": signature},
                        method_name=f"tensorflow/serving/{signature.split('_')[0]}")
    examples_input(multi, [example()])
    call(stub.MultiInference, multi, "grpc-multi", "multi_inference_log")
    _, rpc = stub.Predict.with_call(raw_request([41.0]), timeout=30)  # no id: the server makes one
    made = dict(rpc.trailing_metadata())["x-request-id"]
    assert len(made) == 32 and made not in sent
    sent[made] = "predict_log"
    with pytest.raises(grpc.RpcError):  # failed: counted by the request metrics, not logged
        stub.Predict(raw_request([1.0], signature="no_such_signature"), metadata=[("x-request-id", "failed")], timeout=30)
    channel.close()

    url = f"http://127.0.0.1:{server.rest_port}/v1/models/penguins"
    row = {"bill_length_mm": [45.5], "flipper_length_mm": [210.0], "island": ["Torgersen"]}
    for verb, body, kind in [
        ("predict", {"signature_name": "predict_raw", "instances": [row]}, "predict_log"),
        ("classify", {"examples": [{"bill_length_mm": 40.0, "flipper_length_mm": 190, "island": "Dream"}]}, "classify_log"),
        ("regress", {"signature_name": "regress_body_mass_g",
                     "examples": [{"bill_length_mm": 40.0, "flipper_length_mm": 190, "island": "Dream"}]}, "regress_log"),
    ]:
        answer = requests.post(f"{url}:{verb}", json=body, headers={"x-request-id": f"rest-{verb}"}, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-request-id"] == f"rest-{verb}"
        sent[f"rest-{verb}"] = kind
    return sent


def test_every_api_is_logged_as_a_prediction_log_with_its_request_id(tmp_path, export):
    started = time.time()
    server = start_server(tmp_path, export, sampling_rate=1.0, exclude_features=["island"])
    try:
        sent = send_every_api(server)
        url = f"http://127.0.0.1:{server.rest_port}/monitoring/prometheus/metrics"
        written = f'loopline_request_log_records_total{{model="penguins"}} {len(sent)}'

        def all_written():
            text = requests.get(url, timeout=30).text
            return text if written in text else None

        metrics = wait_for(all_written, 10, "every answer written (the writer takes the queue every 50 ms)")
    finally:
        server.stop(grace=0)  # publishes the open file
    records = list(read_window(str(tmp_path / "request_logs"), "penguins", started - 1, time.time() + 1))
    assert {r.request_id: r.log.WhichOneof("log_type") for r in records} == sent  # no warmup, no failed request
    for record in records:
        meta = record.log.log_metadata
        assert (meta.model_spec.name, meta.model_spec.version.value, record.version) == ("penguins", 1, 1)
        assert meta.sampling_config.sampling_rate == 1.0 and list(meta.saved_model_tags) == ["serve"]
        assert started - 1 <= meta.timestamp_secs <= record.time <= time.time()
        assert b"island" not in record.log.SerializeToString()  # exclude_features: not in any form
    by_id = {r.request_id: r.log for r in records}
    rest = by_id["rest-predict"].predict_log  # REST logged as the PredictRequest its JSON became
    assert rest.request.model_spec.signature_name == "predict_raw"
    assert tf.make_ndarray(rest.request.inputs["bill_length_mm"]).tolist() == [[45.5]]
    assert set(rest.response.outputs) >= {"scores", "classes"}
    assert by_id["rest-predict"].log_metadata.model_spec.signature_name == "predict_raw"
    served = by_id["grpc-predict-raw"].predict_log
    assert tf.make_ndarray(served.request.inputs["bill_length_mm"]).ravel().tolist() == [40.0, 50.0]
    assert tf.make_ndarray(served.response.outputs["scores"]).shape == (2, 3)
    assert len(by_id["grpc-classify"].classify_log.response.result.classifications) == 2
    assert by_id["grpc-multi"].log_metadata.model_spec.signature_name == "classify_species"
    logged_example = example_pb2.Example.FromString(
        by_id["grpc-predict-examples"].predict_log.request.inputs["inputs"].string_val[0])
    assert set(logged_example.features.feature) == {"bill_length_mm", "flipper_length_mm"}
    assert 'loopline_request_errors_total{api="grpc",model="penguins",method="Predict"} 1' in metrics
    assert 'loopline_warmup_requests_total{model="penguins",version="1"} 2' in metrics  # counted, not logged
    (closed,) = closed_files(str(tmp_path / "request_logs"), "penguins")
    assert [row["request_id"] for row in read_index(closed)] == [r.request_id for r in records]


def test_a_malformed_request_id_is_refused_naming_the_header(tmp_path, export):
    server = start_server(tmp_path, export, sampling_rate=1.0)
    try:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}"))
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(raw_request([40.0]), metadata=[("x-request-id", "has space")], timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "x-request-id" in caught.value.details()
        answer = requests.post(f"http://127.0.0.1:{server.rest_port}/v1/models/penguins:classify",
                               json={"examples": [{"bill_length_mm": 40.0}]}, headers={"x-request-id": "x" * 200}, timeout=30)
        assert answer.status_code == 400 and "x-request-id" in answer.json()["error"]
    finally:
        server.stop(grace=0)


def count_logged(tmp_path) -> int:
    return sum(len(read_index(f)) for f in closed_files(str(tmp_path / "request_logs"), "penguins"))


def test_sampling_follows_request_log_json_and_models_config_on_reload(tmp_path, export):
    server = start_server(tmp_path, export, sampling_rate=0.0, max_file_seconds=0.2)
    root = tmp_path / "serving"
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    model_stub = model_service_pb2_grpc.ModelServiceStub(channel)

    def send(n: int) -> None:
        for i in range(n):
            stub.Predict(raw_request([40.0 + i]), timeout=30)

    def reload(text: str):
        config = read_model_server_config(model_config_path(str(root)))
        text_format.Parse(text, config.model_config_list.config[0].logging_config)
        return model_stub.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(config=config), timeout=30)

    try:
        send(5)
        write_request_log_file(str(root), RequestLogConfig(sampling_rate=1.0, max_file_seconds=0.2), str(tmp_path / "request_logs"))
        wait_for(lambda: server.request_log.settings.sampling_rate == 1.0, 10, "request_log.json to be applied")
        send(4)
        wait_for(lambda: count_logged(tmp_path) == 4, 10, "4 logged requests")  # only those after the change
        reload("sampling_config { sampling_rate: 0 }")  # the model's own logging_config wins
        send(3)
        with pytest.raises(grpc.RpcError) as caught:
            reload('log_collector_config { type: "kafka" } sampling_config { sampling_rate: 1 }')
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert caught.value.details().startswith("Cannot find LogCollector::Factory for type: kafka")
        with pytest.raises(grpc.RpcError) as caught:
            reload("sampling_config { sampling_rate: 1.5 }")
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "outside [0, 1]" in caught.value.details()
        send(2)  # the refused configs changed nothing: still the model's rate 0
        reload('log_collector_config { type: "loopline" filename_prefix: "canary" } sampling_config { sampling_rate: 1 }')
        send(1)
        wait_for(lambda: count_logged(tmp_path) == 5, 10, "the request logged under the model's own config")
    finally:
        channel.close()
        server.stop(grace=0)
    names = sorted(f.path.rsplit("/", 1)[1] for f in closed_files(str(tmp_path / "request_logs"), "penguins"))
    assert sum(n.startswith("canary-") for n in names) == 1 and sum(n.startswith("requests-") for n in names) >= 1


def log_pair(version: int = 3, rows: int = 1) -> tuple:
    request = raw_request([40.0] * rows)
    response = predict_pb2.PredictResponse()
    response.model_spec.name, response.model_spec.signature_name = "penguins", "predict_raw"
    response.model_spec.version.value = version
    response.outputs["scores"].CopyFrom(tf.make_tensor_proto(np.full((rows, 3), 1 / 3, np.float32)))
    return request, response


def request_log(root: str, log_dir: str, metrics=None, **settings) -> RequestLog:
    write_request_log_file(root, RequestLogConfig(**settings), log_dir)
    logger = RequestLog(root, metrics, poll_seconds=0.2)
    logger.reload_settings()
    return logger


def test_sampling_is_decided_per_request_at_the_rate(tmp_path):
    logger = request_log(str(tmp_path), str(tmp_path / "logs"), sampling_rate=0.3, queue_size=100000)
    for _ in range(4000):
        logger.log(*log_pair())
    assert 1000 < len(logger._queue) < 1400  # binomial(4000, 0.3): 1200 +- 29 (sd)


def test_records_are_written_as_protobuf_serializes_the_prediction_log():
    from serving.request_log import prediction_log, serialized_log

    for payload in (log_pair(rows=2), (raw_request([40.0]).model_spec, 7, {"x": np.ones((1, 1), np.float32)},
                                       {"scores": np.full((1, 3), 0.5, np.float32)})):
        model, version, entry = prediction_log(payload, 0.25, 1_800_000_000.5)
        got_model, got_version, record = serialized_log(payload, 0.25, 1_800_000_000.5)
        assert (got_model, got_version) == (model, version)
        # Byte for byte in protobuf's canonical form: a map's entries (the request's inputs) come in
        # no set order, and a copied message may write them in another than its source.
        canonical = prediction_log_pb2.PredictionLog.FromString(record).SerializeToString(deterministic=True)
        assert canonical == entry.SerializeToString(deterministic=True)
        assert entry.log_metadata.timestamp_secs == 1_800_000_000 and entry.log_metadata.sampling_config.sampling_rate == 0.25


def test_a_full_queue_drops_and_counts_without_blocking_the_request(tmp_path):
    metrics = Metrics()
    logger = request_log(str(tmp_path), str(tmp_path / "logs"), metrics, sampling_rate=1.0, queue_size=3)  # writer not started
    caller = threading.Thread(target=lambda: [logger.log(*log_pair()) for _ in range(10)])
    caller.start()
    caller.join(10)
    assert not caller.is_alive()  # never waited for room in the queue
    assert 'loopline_request_log_dropped_total{model="penguins",reason="queue_full"} 7' in metrics.render()


def test_a_write_that_fails_is_counted_and_the_writer_goes_on(tmp_path):
    (tmp_path / "not-a-folder").write_text("a file where the log folder should be")
    metrics = Metrics()
    logger = request_log(str(tmp_path), str(tmp_path / "not-a-folder" / "logs"), metrics, sampling_rate=1.0).start()
    for _ in range(3):
        logger.log(*log_pair())
    wait_for(lambda: "write_error" in metrics.render(), 10, "the failed writes to be counted")
    write_request_log_file(str(tmp_path), RequestLogConfig(sampling_rate=1.0), str(tmp_path / "logs"))  # fixed
    wait_for(lambda: logger.log_dir == str(tmp_path / "logs"), 10, "the new folder")
    logger.log(*log_pair())
    logger.stop()
    assert 'loopline_request_log_dropped_total{model="penguins",reason="write_error"} 3' in metrics.render()
    assert len(list(read_window(str(tmp_path / "logs"), "penguins", 0, time.time() + 1))) == 1


def test_files_rotate_by_size_and_time_readers_see_closed_files_and_old_ones_go_on_ram():
    import tests.ram_filesystem  # noqa: F401  (ram:// as an object store: a new object replaces an old one)

    root, log_dir = "ram://rotation/serving", "ram://rotation/request_logs"
    logger = request_log(root, log_dir, sampling_rate=1.0, max_file_mb=0.002, max_file_seconds=3600).start()
    try:
        for _ in range(40):  # ~290 bytes each: files of ~2 KB
            logger.log(*log_pair(rows=2))
        wait_for(lambda: len(closed_files(log_dir, "penguins")) >= 3, 10, "size rotation")
        open_name = next(iter(logger._files.values())).staged.rsplit("/", 1)[1]
        listed = tf.io.gfile.listdir(f"{log_dir}/penguins/3")
        assert open_name in listed and open_name.startswith(".")  # the open file: hidden, not listed as closed
        assert all(f.path.endswith(RECORDS_SUFFIX) for f in closed_files(log_dir, "penguins"))
        write_request_log_file(root, RequestLogConfig(sampling_rate=1.0, max_file_seconds=0.3), log_dir)
        wait_for(lambda: not logger._files, 10, "time rotation to close the last file")  # no new record needed
    finally:
        logger.stop()
    files = closed_files(log_dir, "penguins")
    rows = [row for f in files for row in read_index(f)]
    assert len(rows) == 40 and all(tf.io.gfile.exists(f.index_path) for f in files)
    assert sum(1 for _ in read_window(log_dir, "penguins", files[0].first, files[-1].last + 1)) == 40
    assert all(f.index_path.endswith(INDEX_SUFFIX) for f in files)
    assert delete_older_than(log_dir, cutoff=files[0].first - 1) == 0  # retention keeps what is newer
    assert delete_older_than(log_dir, cutoff=files[-1].last + 1) == len(files)
    assert closed_files(log_dir, "penguins") == [] and tf.io.gfile.listdir(f"{log_dir}/penguins/3") == []


def test_the_log_settings_file_names_a_bad_key(tmp_path):
    from serving.request_log_config import read_request_log_file, request_log_file

    path = request_log_file(str(tmp_path))
    write_request_log_file(str(tmp_path), RequestLogConfig(), str(tmp_path / "logs"))
    data = json.loads(open(path).read())
    data["sampling_rate"] = 2
    open(path, "w").write(json.dumps(data))
    with pytest.raises(ValueError, match="'sampling_rate': Input should be less than or equal to 1"):
        read_request_log_file(path)


def test_a_server_without_a_config_file_runs_its_writer_without_errors(caplog):
    # TF Serving's --model_base_path: no models.config, so no log folder; the writer's retention
    # pass must not reach for one (it logged a traceback at every stop).
    request_log = RequestLog(None)
    request_log.start()
    with caplog.at_level("ERROR", logger="loopline.serving"):
        request_log.stop()
    assert request_log.log_dir is None and not caplog.records
