"""`loopline monitor` in parts: logged requests read back as the examples and predictions the
model saw and gave (every API alike), windows, labels joined by request id, the checks failing
closed, and the whole monitor on a root that is not this machine's disk (ram://, as gs://)."""
from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
from tensorflow_serving.apis import classification_pb2, inference_pb2, predict_pb2, regression_pb2

from pipeline.config import load_config
from pipeline.logged_requests import ServedModel, logged_examples, logged_predictions
from pipeline.monitor import monitor, parse_window, result_lines
from pipeline.monitor_labels import join_labels, read_labels
from serving import service
from serving.request_log import prediction_log
from serving.servable import Servable
from serving.request_limits import RequestLimits
from tests.conftest import REPO
from tests.serving_helpers import example, export_model

SPECIES = ["Adelie", "Chinstrap", "Gentoo"]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return export_model(tmp_path_factory.mktemp("export") / "model")


@pytest.fixture(scope="module")
def servable(export):
    loaded = Servable("penguins", 1, str(export), None, RequestLimits())
    yield loaded
    loaded.unload()


def answered(servable, request):
    """The PredictionLog the server would write for `request` (answered by the same API code)."""
    run = {predict_pb2.PredictRequest: service.predict_on, classification_pb2.ClassificationRequest: service.classify_on,
           regression_pb2.RegressionRequest: service.regress_on,
           inference_pb2.MultiInferenceRequest: service.multi_inference_on}[type(request)]
    return prediction_log((request, run(servable, request, False)), 1.0, 0.0)[2]


def rows(n: int, seed: int, island_new: float = 0.0, scale: float = 1.0) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        island = "Atlantis" if rng.random() < island_new else str(rng.choice(["Biscoe", "Dream", "Torgersen"]))
        out.append(example(float(rng.normal(44, 5)), int(round(rng.normal(200, 14) * scale)), island))
    return out


def test_every_api_reads_back_as_the_same_examples_and_predictions(servable, export):
    model = ServedModel.read(str(export))
    sent = [example(40.0, 190, "Dream"), example(50.0, 220, "Biscoe")]
    sent[0].features.feature["species"].bytes_list.value.append(b"Adelie")  # a label in a request: not data
    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.name = "penguins"
    classify.input.example_list.examples.extend(sent)
    with_context = classification_pb2.ClassificationRequest()
    with_context.model_spec.name = "penguins"
    with_context.input.example_list_with_context.context.features.feature["island"].bytes_list.value.append(b"Dream")
    for e in sent:
        part = with_context.input.example_list_with_context.examples.add()
        part.CopyFrom(e)
        del part.features.feature["island"]
    with_context.input.example_list_with_context.examples[1].features.feature["island"].bytes_list.value.append(b"Biscoe")
    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name, regress.model_spec.signature_name = "penguins", "regress_body_mass_g"
    regress.input.example_list.examples.extend(sent)
    multi = inference_pb2.MultiInferenceRequest()
    for signature in ("classify_species", "regress_body_mass_g"):
        multi.tasks.add(model_spec={"name": "penguins", "signature_name": signature},
                        method_name=f"tensorflow/serving/{signature.split('_')[0]}")
    multi.input.example_list.examples.extend(sent)
    by_examples = predict_pb2.PredictRequest()
    by_examples.model_spec.name, by_examples.model_spec.signature_name = "penguins", "predict"
    by_examples.inputs["inputs"].CopyFrom(tf.make_tensor_proto([e.SerializeToString() for e in sent]))
    raw = predict_pb2.PredictRequest()
    raw.model_spec.name, raw.model_spec.signature_name = "penguins", "predict_raw"
    raw.inputs["bill_length_mm"].CopyFrom(tf.make_tensor_proto(np.array([[40.0], [50.0]], np.float32)))
    raw.inputs["flipper_length_mm"].CopyFrom(tf.make_tensor_proto(np.array([[190.0], [220.0]], np.float32)))
    raw.inputs["island"].CopyFrom(tf.make_tensor_proto(np.array([[b"Dream"], [b"Biscoe"]], dtype=object)))

    expected = [example(40.0, 190, "Dream"), example(50.0, 220, "Biscoe")]
    scores = answered(servable, by_examples).predict_log.response.outputs["species_scores"]
    scores = tf.make_ndarray(scores)
    for request in (classify, with_context, regress, multi, by_examples, raw):
        entry = answered(servable, request)
        assert logged_examples(entry, model) == expected, entry.WhichOneof("log_type")
        predicted = logged_predictions(entry, model)
        if "species" in predicted:
            np.testing.assert_allclose(predicted["species"], scores, rtol=1e-6)
        if "body_mass_g" in predicted:
            assert predicted["body_mass_g"].shape == (2, 1)
    assert set(logged_predictions(answered(servable, regress), model)) == {"body_mass_g"}
    assert set(logged_predictions(answered(servable, raw), model)) == {"species", "body_mass_g"}


def test_predictions_as_columns_give_the_statistics_of_predictions_as_examples():
    """The baseline's eval predictions are summarized from columns, served ones from examples:
    the two must give the same statistics, or monitor would see drift that is not there."""
    from trainer.heads import CLASSIFICATION, REGRESSION, Head
    from trainer.predicted import predicted_columns, predicted_examples
    from validation.statistics import ExampleStatistics

    heads = [Head("species", CLASSIFICATION, vocabulary=SPECIES), Head("body_mass_g", REGRESSION, mean=4000.0, std=800.0)]
    rng = np.random.default_rng(0)
    predicted = {"species": rng.dirichlet(np.ones(3), 500).astype(np.float32),
                 "body_mass_g": rng.normal(4000, 800, (500, 1)).astype(np.float32)}
    # The same batches on both sides: a sketch's merges depend on where the batches start.
    as_examples, as_columns = ExampleStatistics(batch_size=250), ExampleStatistics()
    for example in predicted_examples(predicted, heads):
        as_examples.add(example.SerializeToString())
    for start in (0, 250):
        as_columns.add_batch(predicted_columns({k: v[start:start + 250] for k, v in predicted.items()}, heads))
    expected, got = as_examples.result("eval_predictions"), as_columns.result("eval_predictions")
    assert {f.name or f.path.step[0] for f in got.features} == {"species", "body_mass_g"}
    assert got.num_examples == 500
    assert got == expected


def test_raw_inputs_read_missing_values_as_training_does(servable, export):
    raw = predict_pb2.PredictRequest()
    raw.model_spec.name, raw.model_spec.signature_name = "penguins", "predict_raw"
    raw.inputs["bill_length_mm"].CopyFrom(tf.make_tensor_proto(np.array([[np.nan], [41.5]], np.float32)))
    raw.inputs["flipper_length_mm"].CopyFrom(tf.make_tensor_proto(np.array([[190.0], [200.5]], np.float32)))
    raw.inputs["island"].CopyFrom(tf.make_tensor_proto(np.array([[b""], [b"Dream"]], dtype=object)))
    first, second = logged_examples(answered(servable, raw), ServedModel.read(str(export)))
    assert set(first.features.feature) == {"flipper_length_mm"}  # NaN and "": missing, as an empty CSV cell
    assert list(first.features.feature["flipper_length_mm"].int64_list.value) == [190]  # an int64 feature
    assert list(second.features.feature["flipper_length_mm"].float_list.value) == [200.5]  # kept: a type problem


@pytest.mark.parametrize("since, until, seconds", [("P1D", None, 86400), ("PT6H", None, 6 * 3600),
                                                   ("2026-12-01T00:00:00Z", "2026-12-02T00:00:00+00:00", 86400),
                                                   (None, "2026-12-02", 86400)])
def test_windows_are_iso_8601_times_or_durations(since, until, seconds):
    window = parse_window(since, until, now=1_800_000_000.0)
    assert window.until - window.since == pytest.approx(seconds)
    assert window.until == (1_800_000_000.0 if until is None else window.until)


def test_a_bad_window_names_the_value():
    with pytest.raises(ValueError, match="'yesterday' is not an ISO 8601"):
        parse_window("yesterday", None, now=1_800_000_000.0)
    with pytest.raises(ValueError, match="the window is empty"):
        parse_window("2026-12-02", "2026-12-01", now=1_800_000_000.0)


def test_labels_join_by_request_id_and_example_index(tmp_path, export):
    model = ServedModel.read(str(export))
    scores = np.array([[0.9, 0.05, 0.05], [0.1, 0.8, 0.1]], np.float32)
    answers = {"a": {"species": scores[:1]}, "b": {"species": scores}}
    path = tmp_path / "labels.csv"
    pd.DataFrame({"request_id": ["a", "b", "b", "gone"], "example_index": [0, 0, 1, 0],
                  "species": ["Adelie", "Gentoo", "Chinstrap", "Adelie"]}).to_csv(path, index=False)
    live = join_labels(read_labels(str(path)), answers, model.heads)
    assert live.joined == 3 and live.labelled == 4
    assert live.not_joined == {"request not logged in the window": 1}
    assert live.metrics["species_accuracy"] == pytest.approx(2 / 3)  # a: Adelie right, b0: Gentoo wrong, b1 right
    assert live.metrics["species_examples"] == 3
    pd.DataFrame({"id": ["a"], "species": ["Adelie"]}).to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="no 'request_id' column"):
        read_labels(str(tmp_path / "bad.parquet"))
    with pytest.raises(ValueError, match="must be a .csv or .parquet"):
        (tmp_path / "labels.txt").write_text("request_id\n")
        read_labels(str(tmp_path / "labels.txt"))


def write_root(root: str, export, servable, served: list) -> None:
    """A pushed version with its baseline (data and eval predictions) and a logged window, on `root`."""
    from serving.request_log import RequestLog
    from serving.request_log_config import RequestLogConfig, request_log_dir, write_request_log_file
    from serving.signature_call import signature_caller
    from tracking.remote_files import copy_tree
    from trainer.predicted import EVAL_PREDICTIONS, eval_prediction_batches
    from validation.baseline import write_baseline
    from validation.config import ValidationConfig
    from validation.schema import infer_schema
    from validation.statistics import ExampleStatistics

    copy_tree(str(export), f"{root}/serving/penguins/1")
    splits = {}
    for split, examples in (("train", rows(300, 1)), ("eval", rows(150, 2))):
        for e in examples:
            e.features.feature["species"].bytes_list.value.append(SPECIES[len(e.features.feature["island"].bytes_list.value[0]) % 3].encode())
        stats = ExampleStatistics()
        for e in examples:
            stats.add(e.SerializeToString())
        splits[split] = stats.result(split)
        if split == "eval":
            tf.io.gfile.makedirs(f"{root}/eval")
            with tf.io.TFRecordWriter(f"{root}/eval/data.gz", options="GZIP") as writer:
                for e in examples:
                    writer.write(e.SerializeToString())
    predicted = ExampleStatistics()
    for batch in eval_prediction_batches(f"{root}/serving/penguins/1", f"{root}/eval/data.gz", signature_caller):
        predicted.add_batch(batch)
    splits[EVAL_PREDICTIONS] = predicted.result(EVAL_PREDICTIONS)
    write_baseline(f"{root}/baseline/penguins", infer_schema(splits["train"], ValidationConfig()), splits,
                   {"pushed_version": "1"})
    write_request_log_file(f"{root}/serving", RequestLogConfig(sampling_rate=1.0), request_log_dir(root))
    logger = RequestLog(f"{root}/serving")
    logger.reload_settings()
    for e in served:
        request = classification_pb2.ClassificationRequest()
        request.model_spec.name = "penguins"
        request.input.example_list.examples.append(e)
        logger.log(request, service.classify_on(servable, request, False))
    logger.start().stop()  # writes what is queued and publishes the file


def test_monitor_on_a_ram_root_writes_everything_there(tmp_path, monkeypatch, export, servable):
    import time

    import tests.ram_filesystem  # noqa: F401  (ram:// as an object store)

    monkeypatch.chdir(tmp_path)
    root = "ram://monitored/workspace"
    write_root(root, export, servable, rows(120, 3))
    config = load_config(REPO / "loopline.yaml", [f"pipeline.root={root}", "mlflow.enabled=false"])
    window = parse_window("PT1H", None, time.time() + 1)
    result = monitor(config, window)
    lines = "\n".join(result_lines(result, "penguins"))
    assert result.passed, lines
    (check,) = result.checks
    assert (check.version, check.requests, check.examples) == (1, 120, 120)
    assert set(check.measures["skew"]) == {"bill_length_mm", "flipper_length_mm", "island"}
    assert set(check.measures["predictions"]) == {"species"}  # Classify answers for the default head only
    assert check.out_dir.startswith(f"{root}/monitoring/penguins/1/")
    for name in ("index.html", "summary.json", "Split-served/FeatureStats.pb", "Split-served/SchemaDiff.pb",
                 "bill_length_mm.png"):
        assert tf.io.gfile.exists(f"{check.out_dir}/{name}"), name
    with tf.io.gfile.GFile(f"{check.out_dir}/summary.json") as f:
        assert json.loads(f.read())["passed"] is True
    assert os.listdir(tmp_path) == []  # nothing on this machine's disk

    shifted = rows(120, 4, island_new=0.5, scale=1.5)
    write_root("ram://monitored/shifted", export, servable, shifted)
    config = load_config(REPO / "loopline.yaml", ["pipeline.root=ram://monitored/shifted", "mlflow.enabled=false"])
    result = monitor(config, parse_window("PT1H", None, time.time() + 1))
    assert not result.passed
    assert {p.feature for p in result.checks[0].problems if p.split == "served"} == {"flipper_length_mm", "island"}


def test_what_cannot_be_checked_fails_saying_why(tmp_path, export, servable):
    import time

    config = load_config(REPO / "loopline.yaml", [f"pipeline.root={tmp_path}", "mlflow.enabled=false"])
    result = monitor(config, parse_window("PT1H", None, time.time()))
    assert not result.passed and "no logged requests" in result.failures[0] and "sampling_rate" in result.failures[0]
    root = str(tmp_path / "root")
    write_root(root, export, servable, rows(10, 5))
    tf.io.gfile.rmtree(f"{root}/baseline")
    config = load_config(REPO / "loopline.yaml", [f"pipeline.root={root}", "mlflow.enabled=false"])
    result = monitor(config, parse_window("PT1H", None, time.time() + 1))
    assert not result.passed and "version 1: no baseline names it" in result.failures[0]


def test_a_bad_argument_is_exit_code_2_not_a_crossed_threshold(tmp_path, capsys):
    from pipeline.cli import main

    base = ["monitor", "--config", str(REPO / "loopline.yaml"), "--set", f"pipeline.root={tmp_path}"]
    assert main([*base, "--since", "last tuesday"]) == 2
    assert "'last tuesday' is not an ISO 8601 time" in capsys.readouterr().err
    (tmp_path / "labels.csv").write_text("id,species\na,Adelie\n")
    assert main([*base, "--labels", str(tmp_path / "labels.csv")]) == 2
    assert "no 'request_id' column" in capsys.readouterr().err
    assert main([*base, "--set", "mlflow.enabled=false"]) == 1  # nothing logged: a check that cannot be made
    assert "no logged requests of model penguins" in capsys.readouterr().out
