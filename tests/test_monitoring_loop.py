"""The loop closed, end to end on one root: train and push (a real pipeline run, the server's
request logging switched on through loopline.yaml), serve, send a day of normal traffic and a day
of shifted traffic (flipper_length_mm scaled by 1.5, half the islands a new one) over gRPC and
REST; `loopline monitor` passes on the first day and fails on the second naming both features;
the second day's labels, joined by request id, give a live accuracy below the eval accuracy;
`loopline infer` over the eval split gives the Evaluator's metrics."""
from __future__ import annotations

import contextlib
import datetime
import glob
import io
import json
import os
import time

import grpc
import numpy as np
import pandas as pd
import pytest
import requests
import tensorflow as tf
from mlflow.tracking import MlflowClient
from tensorflow_serving.apis import classification_pb2, predict_pb2, prediction_service_pb2_grpc

from pipeline.cli import main
from tests.conftest import REPO, make_config

pytestmark = pytest.mark.slow


def iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat()


def example_of(row: pd.Series, kinds: dict[str, str]) -> tf.train.Example:
    example = tf.train.Example()
    for column, kind in kinds.items():
        value = row[column]
        if pd.isna(value):
            continue
        feature = example.features.feature[column]
        if kind == "string":
            feature.bytes_list.value.append(str(value).encode())
        elif kind == "int64":
            feature.int64_list.value.append(int(value))
        else:
            feature.float_list.value.append(float(value))
    return example


def send_day(server, rows: pd.DataFrame, kinds: dict[str, str], prefix: str) -> list[str]:
    """One request per row, with its own x-request-id: gRPC Classify, gRPC Predict on
    predict_raw and REST predict in turn. Returns the ids the server returned."""
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    ids = []
    for i, (_, row) in enumerate(rows.iterrows()):
        request_id = f"{prefix}-{i}"
        if i % 3 == 0:
            request = classification_pb2.ClassificationRequest()
            request.model_spec.name = "penguins"
            request.input.example_list.examples.append(example_of(row, kinds))
            _, call = stub.Classify.with_call(request, metadata=[("x-request-id", request_id)], timeout=30)
            returned = dict(call.trailing_metadata())["x-request-id"]
        elif i % 3 == 1:
            request = predict_pb2.PredictRequest()
            request.model_spec.name, request.model_spec.signature_name = "penguins", "predict_raw"
            for column, kind in kinds.items():  # missing: NaN and "", as `loopline predict` sends them
                value = row[column]
                array = (np.array([[b"" if pd.isna(value) else str(value).encode()]], dtype=object) if kind == "string"
                         else np.array([[np.nan if pd.isna(value) else value]], np.float32))
                request.inputs[column].CopyFrom(tf.make_tensor_proto(array))
            _, call = stub.Predict.with_call(request, metadata=[("x-request-id", request_id)], timeout=30)
            returned = dict(call.trailing_metadata())["x-request-id"]
        else:
            instance = {c: ["" if pd.isna(row[c]) else str(row[c])] if kind == "string"
                        else [float("nan") if pd.isna(row[c]) else float(row[c])] for c, kind in kinds.items()}
            answer = requests.post(f"http://127.0.0.1:{server.rest_port}/v1/models/penguins:predict",
                                   data=json.dumps({"signature_name": "predict_raw", "instances": [instance]}),
                                   headers={"x-request-id": request_id}, timeout=30)
            assert answer.status_code == 200, answer.text
            returned = answer.headers["x-request-id"]
        assert returned == request_id
        ids.append(request_id)
    channel.close()
    return ids


def monitor(root, since: float, until: float, *extra: str) -> tuple[int, str]:
    """`loopline monitor` in this process; its exit code and what it printed. (Not capsys: the
    in-process server's uvicorn reconfigures logging, which closes pytest's capture handlers.)"""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["monitor", "--config", str(REPO / "loopline.yaml"), "--set", f"pipeline.root={root}",
                     "--since", iso(since), "--until", iso(until), *extra])
    return code, printed.getvalue()


def test_served_traffic_comes_back_monitored_labelled_and_inferred(tmp_path):
    from pipeline.local_runner import run_local
    from serving.config import ServingConfig
    from serving.server import ModelServer

    root = tmp_path / "workspace"
    overrides = ["export.tflite_variants=[]", "export.required_variants=[]", "serving.request_log.sampling_rate=1.0"]
    summary = run_local(make_config(root, *overrides))
    serving_root = root / "serving"
    assert (serving_root / "request_log.json").exists()  # written by the pipeline beside models.config
    (version_dir,) = glob.glob(str(serving_root / "penguins" / "*"))
    kinds = json.loads((tmp_path / version_dir / "assets.extra" / "loopline_signature.json").read_text())["features"]

    data = pd.read_csv(REPO / "data" / "penguins.csv")
    normal = data.sample(150, random_state=1)
    shifted = data.sample(150, random_state=2).copy()
    shifted["flipper_length_mm"] = (shifted["flipper_length_mm"] * 1.5).round()
    shifted.loc[shifted.index[::2], "island"] = "Atlantis"

    server = ModelServer(str(serving_root), ServingConfig(grpc_port=0, rest_port=0, poll_seconds=0.2)).start()
    try:
        day1 = time.time()
        send_day(server, normal, kinds, "day1")
        day2 = time.time()
        ids = send_day(server, shifted, kinds, "day2")
        end = time.time()
    finally:
        server.stop(grace=0)  # publishes the open log file
    labels = tmp_path / "labels-day2.csv"
    pd.DataFrame({"request_id": ids, "species": shifted["species"].to_numpy()}).to_csv(labels, index=False)

    code, out = monitor(root, day1 - 1, day2)
    assert code == 0, out
    assert "150 requests, 150 examples: passed" in out

    code, out = monitor(root, day2, end + 1, "--labels", str(labels))
    print(out)  # the shifted day's report, for the record (pytest -s)
    assert code == 1, out
    report = json.loads(open(sorted(glob.glob(str(root / "monitoring" / "penguins" / "*" / "*--*" / "summary.json")))[-1]).read())
    served_failed = {p["feature"] for p in report["problems"] if p["split"] == "served"}
    assert served_failed == {"flipper_length_mm", "island"}, out  # both named, nothing else in the data
    assert report["skew"]["flipper_length_mm"]["value"] > report["skew"]["flipper_length_mm"]["threshold"]
    assert report["skew"]["island"]["value"] > report["skew"]["island"]["threshold"]
    assert any(p["kind"] == "ENUM_TYPE_UNEXPECTED_STRING_VALUES" and "Atlantis" in p["description"] for p in report["problems"])
    assert set(report["drift"]) and report["drift"]["island"]["value"] > 0.25  # against day 1's window
    assert "flipper_length_mm" in out and "island" in out
    live = report["live_metrics"]
    assert live["joined"] == 150 and live["labelled"] == 150
    (blessing,) = glob.glob(str(root / "tfx" / "Evaluator" / "blessing" / "*" / "blessing.json"))
    evaluator = json.loads(open(blessing).read())["candidate"]  # the Evaluator's metrics on the eval split
    assert live["metrics"]["species_accuracy"] < evaluator["species_accuracy"] - 0.2
    assert live["eval_metrics"]["species_accuracy"] == pytest.approx(summary.metrics["species_accuracy"])

    client = MlflowClient(f"sqlite:///{root / 'mlflow' / 'mlflow.db'}")
    run_id = client.search_model_versions("name = 'penguins'")[0].run_id
    history = client.get_metric_history(run_id, "monitor/skew/flipper_length_mm")
    # The windows' ends, as the command got them: in ISO 8601 to the microsecond (rounded to the
    # nearest, which can cross a millisecond), then in milliseconds.
    sent_ms = lambda seconds: int(datetime.datetime.fromisoformat(iso(seconds)).timestamp() * 1000)
    assert [m.timestamp for m in history] == [sent_ms(day2), sent_ms(end + 1)]
    assert history[-1].value > 0.25 > history[0].value

    eval_split = glob.glob(str(root / "tfx" / "CsvExampleGen" / "examples" / "*" / "Split-eval" / "*"))
    output = tmp_path / "eval-predictions.parquet"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["infer", "--config", str(REPO / "loopline.yaml"), "--set", f"pipeline.root={root}",
                     "--format", "tfrecord", os.path.dirname(eval_split[0]) + "/*", "--output", str(output),
                     "--no-progress"]) == 0
    assert_evaluators_metrics(output, version_dir, evaluator)
    (infer_run,) = client.search_runs([client.get_experiment_by_name("loopline").experiment_id],
                                      "tags.`loopline.kind` = 'infer'")
    assert infer_run.data.tags["loopline.model_run_id"] == run_id and infer_run.data.metrics["examples"] == 140


def assert_evaluators_metrics(output, version_dir: str, evaluator: dict[str, float]) -> None:
    """The Evaluator's metric code on infer's output file gives the Evaluator's figures."""
    from trainer.evaluation import head_metrics, read_signature

    frame = pd.read_parquet(output)
    _, heads = read_signature(version_dir)
    predictions, labels = {}, {}
    for head in heads:
        if head.kind == "classification":
            predictions[head.name] = frame[[f"predicted_{head.name}_score_{c}" for c in head.vocabulary]].to_numpy(np.float32)
            labels[head.name] = frame[head.label_column].fillna("").astype(str).to_numpy(object).reshape(-1, 1)
        else:
            predictions[head.name] = frame[[f"predicted_{head.name}"]].to_numpy(np.float32)
            labels[head.name] = frame[head.label_column].astype("float32").to_numpy().reshape(-1, 1)
    measured = head_metrics(heads, predictions, labels)
    compared = [k for k in evaluator if k in measured]
    assert {"species_accuracy", "species_loss", "body_mass_g_rmse", "loss"} <= set(compared)
    for key in compared:
        assert measured[key] == pytest.approx(evaluator[key], abs=1e-5), key
