"""Blessing: the decision rules, and real LocalDagRunner runs where only blessed models are pushed."""
from __future__ import annotations

import glob
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from trainer.blessing import decide
from trainer.evaluation import read_examples
from trainer.evaluator_config import Bound, EvaluatorConfig
from trainer.features import parse_examples
from trainer.warmup import read_warmup

# These evaluate_and_decide calls are about the champion and give no train split: the trivial floor
# (tests/test_trivial_floor.py) cannot be computed, which refuses the candidate whatever else passes.
NO_FLOOR = "trivial floor not computed: no train split to fit it on"


def blessed_but_for_the_floor(decision) -> bool:
    return decision.failed == [NO_FLOOR]


def test_thresholds_and_regression_rules():
    config = EvaluatorConfig(thresholds={"species_accuracy": Bound(min=0.8)}, regression_metrics=["loss", "species_accuracy"],
                             relative_tolerance=0.1, absolute_tolerance=0.0)
    good = {"species_accuracy": 0.95, "loss": 0.20}
    assert decide(good, None, config).blessed
    assert decide(good, {"species_accuracy": 0.96, "loss": 0.19}, config).blessed  # within 10%
    worse = decide({"species_accuracy": 0.95, "loss": 0.30}, {"species_accuracy": 0.95, "loss": 0.20}, config)
    assert not worse.blessed and worse.failed == ["loss 0.3 vs champion 0.2 (worse by 0.1, allowed 0.02)"]
    less_accurate = decide({"species_accuracy": 0.81, "loss": 0.2}, {"species_accuracy": 0.99, "loss": 0.2}, config)
    assert not less_accurate.blessed and "species_accuracy 0.81 vs champion 0.99" in less_accurate.failed[0]
    below = decide({"species_accuracy": 0.5, "loss": 0.2}, None, config)
    assert below.failed == ["species_accuracy 0.5 >= min 0.8"]
    unknown = decide(good, None, EvaluatorConfig(thresholds={"auc": Bound(min=0.5)}))
    assert not unknown.blessed and "unknown metric 'auc'" in unknown.failed[0]
    off = decide({"loss": 9.0}, {"loss": 0.1}, EvaluatorConfig(compare_to_champion=False))
    assert off.blessed


def test_gate_fails_closed_when_the_champion_cannot_be_compared():
    config = EvaluatorConfig(regression_metrics=["loss", "species_accuracy"])
    good = {"species_accuracy": 0.95, "loss": 0.20}
    broken = decide(good, None, config, "/serving/m/7", champion_problem="/serving/m/7 could not be evaluated (ValueError: x)")
    assert not broken.blessed
    assert broken.failed == ["champion not compared: /serving/m/7 could not be evaluated (ValueError: x) "
                             "(evaluator.on_champion_error is refuse)"]
    # A metric the champion lacks is a champion that cannot be compared.
    no_accuracy = decide(good, {"loss": 0.2}, config)
    assert not no_accuracy.blessed and "the champion has no species_accuracy" in no_accuracy.failed[0]
    # A metric the candidate lacks fails whatever the policy says.
    lenient = config.model_copy(update={"on_champion_error": "thresholds_only"})
    no_loss = decide({"species_accuracy": 0.95}, {"species_accuracy": 0.9, "loss": 0.2}, lenient)
    assert not no_loss.blessed and no_loss.failed[0].startswith("loss not compared: the candidate has no such metric")
    # thresholds_only blesses on the thresholds alone and says so; the thresholds still bind.
    allowed = decide(good, None, lenient, champion_problem="heads differ")
    assert allowed.blessed and any("blessed on the thresholds alone" in r for r in allowed.reasons)
    strict = lenient.model_copy(update={"thresholds": {"species_accuracy": Bound(min=0.99)}})
    assert not decide(good, None, strict, champion_problem="heads differ").blessed


def test_champion_that_cannot_read_the_new_data_blocks_the_candidate(tmp_path):
    """The daily-run failure: a numeric column picked up text; the candidate trained on it reads
    it as a string, the champion cannot parse the new eval split. The gate must say no."""
    from tests.serving_helpers import example, export_model
    from trainer.blessing import evaluate_and_decide

    champion = export_model(tmp_path / "champion")  # bill_length_mm: float32
    candidate = export_model(tmp_path / "candidate", kinds={"bill_length_mm": "string"})
    records = []
    for i in range(6):
        e = example(island="Dream")
        del e.features.feature["bill_length_mm"]
        e.features.feature["bill_length_mm"].bytes_list.value.append(b"n/a" if i % 2 else b"41.5")
        e.features.feature["species"].bytes_list.value.append(b"Adelie")
        e.features.feature["body_mass_g"].float_list.value.append(3900.0)
        records.append(e.SerializeToString())
    split = tmp_path / "eval.gz"
    with tf.io.TFRecordWriter(str(split), options="GZIP") as writer:
        for record in records:
            writer.write(record)

    refused = evaluate_and_decide(str(candidate), str(split), str(champion), EvaluatorConfig())
    assert not refused.blessed
    assert len(refused.failed) == 2 and "could not be evaluated" in refused.failed[1], refused.failed
    assert refused.champion_path == str(champion) and refused.champion is None
    lenient = evaluate_and_decide(str(candidate), str(split), str(champion), EvaluatorConfig(on_champion_error="thresholds_only"))
    assert blessed_but_for_the_floor(lenient) and "thresholds alone" in " ".join(lenient.reasons)


def _penguin_split(path, n: int = 6) -> str:
    from tests.serving_helpers import example

    with tf.io.TFRecordWriter(str(path), options="GZIP") as writer:
        for i in range(n):
            e = example(bill=38.0 + i, flipper=185 + 3 * i, island=["Dream", "Biscoe"][i % 2])
            e.features.feature["species"].bytes_list.value.append([b"Adelie", b"Gentoo", b"Chinstrap"][i % 3])
            e.features.feature["body_mass_g"].float_list.value.append(3500.0 + 100 * i)
            writer.write(e.SerializeToString())
    return str(path)


def test_champion_exported_before_the_tf_serving_signatures_is_still_evaluated(tmp_path):
    """A champion in the old layout (one serving_default with every head's outputs) is evaluated
    through that signature; the same weights in the new layout give the same metrics."""
    from tests.serving_helpers import export_model
    from trainer.blessing import evaluate_and_decide
    from trainer.evaluation import evaluate_saved_model

    old = export_model(tmp_path / "old", old_layout=True)
    new = export_model(tmp_path / "new")  # same seed: same weights
    loaded = tf.saved_model.load(str(old))
    assert set(loaded.signatures) == {"serving_default", "predict_raw"}
    assert "body_mass_g" in loaded.signatures["serving_default"].structured_outputs
    split = _penguin_split(tmp_path / "eval.gz")
    examples = read_examples(split)
    old_metrics, new_metrics = evaluate_saved_model(str(old), examples), evaluate_saved_model(str(new), examples)
    assert set(old_metrics) == {"species_loss", "species_accuracy", "species_examples", "species_unseen_label_examples",
                                "body_mass_g_loss", "body_mass_g_rmse", "body_mass_g_examples", "loss"}
    for key, value in new_metrics.items():
        assert old_metrics[key] == pytest.approx(value, rel=1e-5), key
    decision = evaluate_and_decide(str(new), split, str(old), EvaluatorConfig())
    assert blessed_but_for_the_floor(decision) and decision.champion is not None, decision.failed
    assert decision.champion["loss"] == pytest.approx(old_metrics["loss"], rel=1e-6)


def test_champion_is_the_labelled_version_else_the_latest(tmp_path):
    from tensorflow_serving.config import model_server_config_pb2

    from serving.model_config import labelled_or_latest_version as champion_dir
    from serving.model_config import model_config_path, set_version_labels, write_model_server_config

    base = tmp_path / "m"
    assert champion_dir(str(tmp_path), "m", "stable") is None
    for version in ("9", "10", "tmp", "11"):
        (base / version).mkdir(parents=True)
    for version in ("9", "10", "tmp"):
        (base / version / "saved_model.pb").write_bytes(b"x")
    assert champion_dir(str(tmp_path), "m", "stable") == str(base / "10")  # 11 has no SavedModel yet

    config = model_server_config_pb2.ModelServerConfig()
    config.model_config_list.config.add(name="m", base_path=str(base), model_platform="tensorflow")
    write_model_server_config(model_config_path(str(tmp_path)), config)
    set_version_labels(model_config_path(str(tmp_path)), "m", {"stable": 9})
    assert champion_dir(str(tmp_path), "m", "stable") == str(base / "9")  # promoted, though older
    assert champion_dir(str(tmp_path), "m", "canary") == str(base / "10")


@pytest.mark.slow
def test_pushed_model_answers_both_signatures_identically(pipeline_run):
    config, summary = pipeline_run
    assert summary.blessed is True and any("no champion yet" in r for r in summary.blessing_reasons)
    pushed = summary.pushed_path
    logs = read_warmup(pushed)
    assert [log.classify_log.request.model_spec.signature_name for log in logs[:1]] == ["serving_default"]
    assert [log.predict_log.request.model_spec.signature_name for log in logs[1:]] == ["predict", "predict_raw"]
    eval_files = glob.glob(os.path.join(config.pipeline.root, "tfx", "CsvExampleGen", "examples", "*", "Split-eval", "*"))
    examples = read_examples(eval_files[0])
    loaded = tf.saved_model.load(pushed)
    from_examples = loaded.signatures["serving_default"](inputs=tf.constant(examples))
    kinds = json.load(open(os.path.join(pushed, "assets.extra", "loopline_signature.json")))["features"]
    raw = parse_examples(tf.constant(examples), kinds)
    from_raw = loaded.signatures["predict_raw"](**raw)
    np.testing.assert_allclose(from_raw["scores"].numpy(), from_examples["scores"].numpy(), atol=1e-6)
    assert (from_raw["classes"].numpy() == from_examples["classes"].numpy()).all()
    # The export report sits in the Model artifact, completed with the blessing in the blessing's.
    model_dir = os.path.dirname(summary.saved_model)
    report = json.load(open(os.path.join(model_dir, "export_report.json")))
    assert [v["variant"] for v in report["tflite"]] == ["float32", "dynamic_range"]
    assert all(v["passed"] for v in report["tflite"])
    blessed_reports = glob.glob(os.path.join(config.pipeline.root, "tfx", "Evaluator", "blessing", "*", "export_report.md"))
    assert any("**blessed**" in open(p).read() for p in blessed_reports)


@pytest.mark.slow
def test_worse_candidate_is_not_pushed(pipeline_run, tmp_path):
    from pipeline.local_runner import run_local
    from conftest import make_config

    champion_config, champion = pipeline_run
    # A fresh workspace whose serving folder holds the normal run's pushed model: the champion.
    config = make_config(tmp_path, "trainer.epochs=1", "trainer.learning_rate=0.0003", "trainer.max_steps=2")
    target = os.path.join(config.pipeline.root, "serving", config.serving.model_name, champion.version)
    shutil.copytree(champion.pushed_path, target)
    summary = run_local(config)
    assert summary.executions["Pusher"] == "COMPLETE"
    assert summary.blessed is False
    assert summary.version is None and summary.pushed_path is None
    assert any(r.startswith("FAILED loss") and "vs champion" in r for r in summary.blessing_reasons), summary.blessing_reasons
    assert "NOT blessed" in "\n".join(summary.lines())
    assert os.listdir(os.path.dirname(target)) == [champion.version]  # nothing new was pushed


def test_accepted_data_changes_bless_on_the_thresholds_when_the_champion_cannot_be_compared():
    """The one exception to the fail-closed rule: the data changed on purpose, so a champion that
    cannot read it does not refuse the candidate; the thresholds still bind, and the reason says why."""
    config = EvaluatorConfig()  # on_champion_error: refuse
    good = {"species_accuracy": 0.95, "loss": 0.20}
    because = "the data changed on purpose: loopline data accept: run r1: [train] x: SCHEMA_MISSING_COLUMN"
    accepted = decide(good, None, config, "/serving/m/7", champion_problem="cannot parse", thresholds_only_because=because)
    assert accepted.blessed
    assert f"champion not compared: cannot parse; blessed on the thresholds alone ({because})" in accepted.reasons
    strict = config.model_copy(update={"thresholds": {"species_accuracy": Bound(min=0.99)}})
    assert not decide(good, None, strict, champion_problem="cannot parse", thresholds_only_because=because).blessed
    # A champion that can be compared still is: a regression refuses the candidate.
    worse = decide(good, {"species_accuracy": 0.95, "loss": 0.1}, config, thresholds_only_because=because)
    assert not worse.blessed


@pytest.fixture(scope="module")
def two_layouts(tmp_path_factory):
    """The same weights exported in the current layout and the old one, and a 10-row eval split."""
    from tests.serving_helpers import export_model

    root = tmp_path_factory.mktemp("layouts")
    return str(export_model(root / "new")), str(export_model(root / "old", old_layout=True)), _penguin_split(root / "eval.gz", 10)


def test_the_servers_session_callable_gives_the_eager_metrics(two_layouts, monkeypatch):
    """The Evaluator's fast path (the server's Session callable, large batches) computes what the
    eager signature call does, for both layouts; without the private Session API it still does
    (through the server's eager fallback)."""
    import serving.signature_call as signature_call
    from trainer.evaluation import evaluate_saved_model

    new, old, split = two_layouts
    examples = read_examples(split)
    eager = {path: evaluate_saved_model(path, examples, batch_size=3) for path in (new, old)}

    def no_eager_fallback(*args):
        raise AssertionError("the Session callable fell back to the eager call")

    with monkeypatch.context() as patch:
        patch.setattr(signature_call, "_eager_callers", no_eager_fallback)
        for path in (new, old):
            fast = evaluate_saved_model(path, examples, batch_size=4096, open_signature=signature_call.signature_caller)
            assert fast.keys() == eager[path].keys() and fast["species_examples"] == 10
            for key, value in eager[path].items():
                assert fast[key] == pytest.approx(value, rel=1e-6, abs=1e-9), (path, key)

    from tensorflow.python.client import session as session_lib

    monkeypatch.delattr(session_lib.BaseSession, "_make_callable_from_options")
    fallback = evaluate_saved_model(new, examples, open_signature=signature_call.signature_caller)
    for key, value in eager[new].items():
        assert fallback[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key


def _recording(events: list, fail_at: tuple[str, int] | None = None):
    """An OpenSignature over the server's Session callable that records each call and its closing
    (and can make one model's n-th call fail)."""
    from contextlib import contextmanager

    from serving.signature_call import signature_caller

    @contextmanager
    def open_signature(path, signature, outputs=None):
        name = os.path.basename(path)
        with signature_caller(path, signature, outputs=outputs) as call:
            def recorded(inputs):
                events.append((name, len(inputs["inputs"])))
                if fail_at == (name, sum(e[0] == name for e in events)):
                    raise tf.errors.InvalidArgumentError(None, None, "injected failure")
                return call(inputs)
            yield recorded
        events.append((name, "closed"))

    return open_signature


def _counting_reader(events: list, monkeypatch):
    """Replaces the Evaluator's reader by one that records each batch it hands out; it can be
    iterated once only, as a stream."""
    import trainer.blessing as blessing
    from trainer.evaluation import example_batches

    def reader(*args):
        events.append(("open reader", 0))
        for batch in example_batches(*args):
            events.append(("read", len(batch[0])))
            yield batch

    monkeypatch.setattr(blessing, "example_batches", reader)


def test_candidate_and_champion_are_fed_each_batch_of_one_streamed_pass(two_layouts, monkeypatch):
    from trainer.blessing import evaluate_and_decide

    new, old, split = two_layouts
    events: list = []
    _counting_reader(events, monkeypatch)
    decision = evaluate_and_decide(new, split, old, EvaluatorConfig(batch_size=4), open_signature=_recording(events))
    assert blessed_but_for_the_floor(decision)
    assert decision.candidate["species_examples"] == decision.champion["species_examples"] == 10
    # One reader, one pass; each batch goes to both models before the next is read (nothing is
    # read ahead into a list).
    assert events == ([("open reader", 0)] + [e for n in (4, 4, 2) for e in (("read", n), ("new", n), ("old", n))]
                      + [("old", "closed"), ("new", "closed")])

    events.clear()
    limited = evaluate_and_decide(new, split, old, EvaluatorConfig(batch_size=4, eval_examples=5), open_signature=_recording(events))
    assert limited.candidate["species_examples"] == limited.champion["species_examples"] == 5
    assert [e for e in events if e[0] == "read"] == [("read", 4), ("read", 1)]


def test_champion_failing_mid_pass_refuses_the_candidate_whose_evaluation_completes(two_layouts, monkeypatch):
    from trainer.blessing import evaluate_and_decide

    new, old, split = two_layouts
    events: list = []
    _counting_reader(events, monkeypatch)
    refused = evaluate_and_decide(new, split, old, EvaluatorConfig(batch_size=4), open_signature=_recording(events, ("old", 2)))
    assert not refused.blessed and refused.champion is None and refused.champion_path == old
    assert refused.candidate["species_examples"] == 10  # the candidate saw the whole split
    assert refused.failed == [NO_FLOOR, f"champion not compared: {old} could not be evaluated on examples 4-7 of {split} "
                              "(InvalidArgumentError: injected failure) (evaluator.on_champion_error is refuse)"]
    # Not called after it failed, and closed then (its memory back before the pass ends).
    assert [e for e in events if e[0] == "old"] == [("old", 4), ("old", 4), ("old", "closed")]
    assert events.index(("old", "closed")) < events.index(("new", 2))
    lenient = evaluate_and_decide(new, split, old, EvaluatorConfig(batch_size=4, on_champion_error="thresholds_only"),
                                  open_signature=_recording([], ("old", 2)))
    assert blessed_but_for_the_floor(lenient) and "thresholds alone" in " ".join(lenient.reasons)


def test_each_batch_is_scored_in_one_graph_traced_once_with_the_eager_figures(two_layouts, monkeypatch):
    """The Evaluator scores a batch (labels encoded, the candidate's and the trivial model's losses,
    the per-row gains) in one compiled call, traced once whatever the last batch's size; the
    figures are those of the same steps run eagerly, batch by batch."""
    import trainer.evaluation as evaluation
    from trainer.heads import CLASSIFICATION, HeadTotals
    from trainer.trivial import TrivialModel

    new, _, split = two_layouts
    heads = evaluation.read_signature(new)[1]
    summaries = {h.name: {v: i + 1 for i, v in enumerate(h.vocabulary)} if h.kind == CLASSIFICATION else 4000.0
                 for h in heads}
    compiled, original = [], evaluation._compiled
    monkeypatch.setattr(evaluation, "_compiled", lambda *args: compiled.append(original(*args)) or compiled[-1])
    trivial = TrivialModel.from_label_summaries(heads, summaries)
    batches = evaluation.example_batches(split, 4, evaluation.label_kinds(heads))  # 4, 4 and 2 rows
    metrics = evaluation.evaluate_with_champion(new, None, batches, trivial=trivial)[0]
    assert len(compiled) == 1 and compiled[0].experimental_get_tracing_count() == 1

    eager_trivial, totals = TrivialModel.from_label_summaries(heads, summaries), HeadTotals(heads)
    signature, keys = evaluation.evaluation_signature(2, heads)
    with evaluation.eager_signature(new, signature) as call:
        for batch, labels in evaluation.example_batches(split, 4, evaluation.label_kinds(heads)):
            out = call({"inputs": batch})
            targets = {h.name: h.encode_label(tf.constant(labels[h.name])) for h in heads}
            outputs = {h.name: tf.constant(out[keys[h.name]], tf.float32) for h in heads}
            eager_trivial.score(targets, totals.add(targets, outputs))
    assert metrics["species_examples"] == 10 and metrics.keys() == totals.metrics().keys()
    for got, want in ((metrics, totals.metrics()), (trivial.metrics(), eager_trivial.metrics())):
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    gains, eager_gains = trivial.gains(), eager_trivial.gains()
    assert gains.keys() == eager_gains.keys() == {h.name for h in heads}
    for name, gain in eager_gains.items():
        assert gains[name].rows == gain.rows == 10
        assert gains[name].mean == pytest.approx(gain.mean, rel=1e-6)
        assert gains[name].standard_error == pytest.approx(gain.standard_error, rel=1e-6)
