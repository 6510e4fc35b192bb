"""The Evaluator's slices: figures per slice in the same pass, per-slice gates (the default guard
and TFMA's MetricThresholds), slices.json and TFMA's format, and TFMA as the oracle."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from pydantic import ValidationError

from trainer.evaluator_config import EvaluatorConfig, SlicingSpec, SliceThreshold
from trainer.heads import CLASSIFICATION, REGRESSION, Head

SPECIES = ["Adelie", "Chinstrap", "Gentoo"]
HEADS = [Head("species", CLASSIFICATION, vocabulary=SPECIES),
         Head("body_mass_g", REGRESSION, mean=4200, std=800, label_dtype="float32")]
# The eval split: Torgersen is 40 rows of 1000, enough to be judged (min_slice_size 30).
ISLANDS = ["Biscoe"] * 560 + ["Dream"] * 400 + ["Torgersen"] * 40
TRAIN_LABELS = {"species": {"Adelie": 150, "Chinstrap": 70, "Gentoo": 120}, "body_mass_g": 4200.0}


def _split(path, seed: int = 0) -> str:
    """GZIP tf.Examples: species, island, sex (missing in every 7th row), body_mass_g."""
    rng = np.random.default_rng(seed)
    with tf.io.TFRecordWriter(str(path), options="GZIP") as writer:
        for i, island in enumerate(ISLANDS):
            e = tf.train.Example()
            f = e.features.feature
            f["species"].bytes_list.value.append(SPECIES[int(rng.integers(0, 3))].encode())
            f["island"].bytes_list.value.append(island.encode())
            if i % 7:
                f["sex"].bytes_list.value.append(b"male" if rng.random() < 0.5 else b"female")
            f["body_mass_g"].float_list.value.append(float(rng.normal(4200, 800)))
            f["year"].int64_list.value.append(2007 + i % 3)
            writer.write(e.SerializeToString())
    return str(path)


class _Oracle(tf.Module):
    """A model that reads the answer from the example: `p` on the true species (the rest split
    evenly), the true body mass; on `scrambled` island's rows, 0.35 on the true species and 0.45
    on the next one (always wrong there)."""

    def __init__(self, p: float, scrambled: str | None, mass_scale: float = 1.0):
        super().__init__()
        self.p, self.scrambled, self.mass_scale = p, scrambled, mass_scale

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def predict(self, inputs):
        parsed = tf.io.parse_example(inputs, {"species": tf.io.FixedLenFeature([], tf.string, ""),
                                              "island": tf.io.FixedLenFeature([], tf.string, ""),
                                              "body_mass_g": tf.io.FixedLenFeature([], tf.float32, 0.0)})
        index = tf.argmax(tf.cast(tf.equal(parsed["species"][:, None], tf.constant(SPECIES)[None, :]), tf.int32), axis=1)
        true = tf.one_hot(index, 3)
        scores = true * self.p + (1 - true) * (1 - self.p) / 2
        if self.scrambled:
            wrong = tf.one_hot((index + 1) % 3, 3)
            bad = true * 0.35 + wrong * 0.45 + (1 - true - wrong) * 0.2
            scores = tf.where(tf.equal(parsed["island"], self.scrambled)[:, None], bad, scores)
        return {"species_scores": scores, "body_mass_g_outputs": parsed["body_mass_g"][:, None] * self.mass_scale}


def _oracle_model(path, p: float = 0.6, scrambled: str | None = None, mass_scale: float = 1.0) -> str:
    module = _Oracle(p, scrambled, mass_scale)
    tf.saved_model.save(module, str(path), signatures={"predict": module.predict})
    os.makedirs(os.path.join(path, "assets.extra"), exist_ok=True)
    with open(os.path.join(path, "assets.extra", "loopline_signature.json"), "w") as f:
        json.dump({"features": {}, "heads": [h.to_json() for h in HEADS], "layout": 2}, f)
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("slices")
    return {"champion": _oracle_model(root / "champion"), "scrambled": _oracle_model(root / "scrambled", scrambled="Torgersen"),
            "off": _oracle_model(root / "off", p=0.5, scrambled="Dream", mass_scale=0.9),
            "split": _split(root / "eval.gz"), "root": root}


def _decide(models, config: EvaluatorConfig, candidate: str = "scrambled"):
    from trainer.blessing import evaluate_and_decide

    return evaluate_and_decide(models[candidate], models["split"], models["champion"], config, train_labels=TRAIN_LABELS)


def test_scrambled_island_is_blessed_overall_and_refused_by_its_slice(models):
    before = _decide(models, EvaluatorConfig())
    assert before.blessed, before.failed  # within the overall tolerance: loss +4%
    assert before.candidate["loss"] == pytest.approx(0.96 * -np.log(0.6) - 0.04 * np.log(0.35), rel=1e-5)
    after = _decide(models, EvaluatorConfig(slicing_specs=[SlicingSpec(feature_keys=["island"])],
                                            regression_metrics=["loss", "species_accuracy"]))
    assert not after.blessed
    assert after.failed == [
        f"slice island=Torgersen: loss {-np.log(0.35):.4g} vs champion {-np.log(0.6):.4g} (worse by "
        f"{np.log(0.6) - np.log(0.35):.4g}, allowed {0.05 * -np.log(0.6):.4g})",
        "slice island=Torgersen: species_accuracy 0 vs champion 1 (worse by 1, allowed 0.05)"]
    slices = after.slices_json()
    torgersen = next(s for s in slices["slices"] if s["slice"] == "island=Torgersen")
    assert torgersen["examples"] == 40 and torgersen["gated"]
    assert torgersen["candidate"]["species_accuracy"] == 0 and torgersen["champion"]["species_accuracy"] == 1
    print(f"\nscrambled Torgersen: before (no slices) blessed={before.blessed} overall loss "
          f"{before.candidate['loss']:.4f} vs {before.champion['loss']:.4f}; after: {after.summary()}")


def test_figures_per_slice_cross_bucket_and_missing_values(models):
    config = EvaluatorConfig(slicing_specs=[
        SlicingSpec(feature_keys=["island", "sex"]), SlicingSpec(feature_values={"island": "Dream"}),
        SlicingSpec(feature_buckets={"body_mass_g": [3500, 4500]}), SlicingSpec(feature_keys=["year"])], batch_size=128)
    decision = _decide(models, config)
    slices = {s["slice"]: s for s in decision.slices_json()["slices"]}
    examples = [tf.train.Example.FromString(r) for r in tf.data.TFRecordDataset(models["split"], "GZIP").as_numpy_iterator()]

    def value(e, name):
        f = e.features.feature[name]
        return (list(f.bytes_list.value) or list(f.int64_list.value) or list(f.float_list.value) or [None])[0]

    def rows(predicate):
        return [e for e in examples if predicate(e)]

    overall = slices["Overall"]
    assert list(slices)[0] == "Overall" and overall["examples"] == 1000
    for key, figure in decision.candidate.items():  # the Overall slice is the overall evaluation
        assert overall["candidate"][key] == pytest.approx(figure, rel=1e-6), key  # float32 sums
    # A cross: rows without a sex are in none of its slices (as in TFMA).
    cross = rows(lambda e: value(e, "island") == b"Biscoe" and value(e, "sex") == b"male")
    assert slices["island=Biscoe,sex=male"]["examples"] == len(cross)
    assert sum(s["examples"] for n, s in slices.items() if ",sex=" in n) == sum(1 for i in range(1000) if i % 7)
    assert slices["island=Dream"]["examples"] == 400 and "island=Biscoe" not in slices
    low = rows(lambda e: value(e, "body_mass_g") < 3500)
    assert slices["body_mass_g=(-inf,3500)"]["examples"] == len(low)
    assert slices["body_mass_g=[3500,4500)"]["features"] == {"body_mass_g": "[3500,4500)"}
    assert {n for n in slices if n.startswith("year=")} == {"year=2007", "year=2008", "year=2009"}
    # The scrambled island's confusion matrix: every row predicted as the next class.
    torgersen = rows(lambda e: value(e, "island") == b"Torgersen")
    assert slices["body_mass_g=(-inf,3500)"]["candidate"]["body_mass_g_mae"] == pytest.approx(0.0, abs=1e-3)
    cross_torgersen = [s for n, s in slices.items() if n.startswith("island=Torgersen,")]
    matrix = np.sum([s["confusion"]["species"]["matrix"] for s in cross_torgersen], axis=0)
    truth = np.bincount([SPECIES.index(value(e, "species").decode()) for e in torgersen if value(e, "sex")], minlength=3)
    assert (np.diag(matrix) == 0).all() and [matrix[i, (i + 1) % 3] for i in range(3)] == truth.tolist()
    # Slices under min_slice_size are reported, not gated, and named in the reasons.
    small = [n for n, s in slices.items() if s["examples"] < 30]
    assert small and not any(slices[n]["gated"] for n in small)
    assert any(r.startswith("slices reported, not gated") and small[0] in r for r in decision.reasons)
    calibration = decision.slices_json()["calibration"]["species"]
    assert sum(b["examples"] for b in calibration) == 1000
    assert [(b["lower"], b["examples"], b["observed"]) for b in calibration] == [(0.4, 40, 0.0), (0.6, 960, 1.0)]
    assert [b["mean_prediction"] for b in calibration] == pytest.approx([0.45, 0.6], rel=1e-5)  # top scores, float32 sums


def test_thresholds_follow_tfmas_metric_threshold_semantics():
    from trainer.slice_gates import gate

    def report(candidate: float, champion: float | None, examples: int = 50):
        return {"slices": [{"slice": "island=Dream", "features": {"island": "Dream"}, "_key": (("island", "Dream"),),
                            "examples": examples, "candidate": {"species_accuracy": candidate},
                            "champion": None if champion is None else {"species_accuracy": champion}}]}

    island = {"feature_keys": ["island"]}

    def passed(threshold: dict, candidate: float, champion: float | None, examples: int = 50) -> list[bool]:
        config = EvaluatorConfig(slice_guard=False, slicing_specs=[island], slice_thresholds=[SliceThreshold.model_validate(
            {"slicing_specs": [island], "metric": "species_accuracy", **threshold})])
        return [g["passed"] for g in gate(report(candidate, champion, examples), config, champion is not None)]

    assert passed({"value_threshold": {"lower_bound": 0.8}}, 0.8, None) == [True]
    assert passed({"value_threshold": {"lower_bound": 0.8, "upper_bound": 0.9}}, 0.95, None) == [False]
    higher = {"change_threshold": {"direction": "higher_is_better", "absolute": -0.05}}
    assert passed(higher, 0.90, 0.94) == [True] and passed(higher, 0.88, 0.94) == [False]
    assert passed(higher, 0.5, None) == []  # no champion: a change is not judged
    assert passed(higher, 0.5, 0.9, examples=10) == []  # too small to judge
    relative = {"change_threshold": {"direction": "lower_is_better", "relative": 0.1}}
    assert passed(relative, 1.05, 1.0) == [True] and passed(relative, 1.2, 1.0) == [False]
    assert passed(relative, 0.0, 0.0) == [False]  # TFMA: a relative change against 0 is NaN, and fails
    sex = SlicingSpec(feature_keys=["sex"])
    spec_elsewhere = EvaluatorConfig(slicing_specs=[sex], slice_thresholds=[SliceThreshold(
        slicing_specs=[sex], metric="species_accuracy", value_threshold={"lower_bound": 1})])
    # It applies to the sex slices only; the report has none, which fails as TFMA's missing slices do.
    [missing_sex] = gate(report(0.1, None), spec_elsewhere, False)
    assert not missing_sex["passed"] and "no evaluated slice" in missing_sex["text"]
    with pytest.raises(ValidationError, match=r"slicing spec \{'feature_keys': \['sex'\]\} is not within evaluator.slicing_specs"):
        EvaluatorConfig(slice_thresholds=spec_elsewhere.slice_thresholds)
    # One value's slice is within a spec of its feature (TFMA's is_slice_applicable); another feature's is not.
    one_island = [SliceThreshold(slicing_specs=[{"feature_values": {"island": "Dream"}}], metric="species_accuracy")]
    assert EvaluatorConfig(slicing_specs=[island], slice_thresholds=one_island)
    with pytest.raises(ValidationError, match="is not within"):
        EvaluatorConfig(slicing_specs=[sex], slice_thresholds=one_island)
    # Fail closed: a gated metric the candidate does not have refuses it.
    unknown = EvaluatorConfig(slicing_specs=[island], slice_thresholds=[SliceThreshold(
        slicing_specs=[island], metric="species_auc", value_threshold={"lower_bound": 0.5})])
    [missing] = gate(report(0.9, None), unknown, False)
    assert not missing["passed"] and "species_auc not computed for the candidate" in missing["text"]


def test_slice_thresholds_refuse_in_the_blessing_and_the_tfma_result_reads_back(models, tmp_path):
    import tensorflow_model_analysis as tfma

    from components.evaluator import write_slices
    from trainer.slicing import SLICES_JSON, TFMA_FOLDER

    config = EvaluatorConfig(slicing_specs=[SlicingSpec(feature_keys=["island"])], slice_guard=False,
                             slice_thresholds=[SliceThreshold(slicing_specs=[SlicingSpec(feature_keys=["island"])],
                                                              metric="species_accuracy", value_threshold={"lower_bound": 0.5})])
    decision = _decide(models, config)
    assert decision.failed == ["slice island=Torgersen: species_accuracy 0 in [0.5, inf]"]
    write_slices(str(tmp_path), decision, config, ["species", "body_mass_g"], models["scrambled"], models["split"])
    written = json.loads((tmp_path / SLICES_JSON).read_text())
    assert written == json.loads(json.dumps(decision.slices_json()))
    assert [g["passed"] for g in written["gates"]] == [True, True, False]

    result = tfma.load_eval_result(str(tmp_path / TFMA_FOLDER))
    metrics = dict(result.slicing_metrics)
    assert set(metrics) == {(), (("island", "Biscoe"),), (("island", "Dream"),), (("island", "Torgersen"),)}
    torgersen = metrics[(("island", "Torgersen"),)]
    assert torgersen["species"][""]["accuracy"]["doubleValue"] == 0.0
    assert torgersen["species"][""]["accuracy_diff"]["doubleValue"] == -1.0  # candidate - baseline
    assert torgersen[""][""]["example_count"]["doubleValue"] == 40
    assert tfma.load_eval_result(str(tmp_path / TFMA_FOLDER), model_name="baseline").slicing_metrics
    plots = dict(result.plots)
    entries = plots[(("island", "Torgersen"),)]["species"][""]["multiClassConfusionMatrixAtThresholds"]["matrices"][0]["entries"]
    assert sum(e.get("numWeightedExamples", 0) for e in entries) == 40
    assert "calibrationHistogramBuckets" in plots[()]["species"][""]
    assert [s.feature_keys for s in result.config.slicing_specs] == [[], ["island"]]
    validation = tfma.load_validation_result(str(tmp_path / TFMA_FOLDER))
    assert not validation.validation_ok
    assert [k.column for v in validation.metric_validations_per_slice for k in v.slice_key.single_slice_keys] == ["island"]


def test_per_slice_figures_match_tfmas_own_computation(models, tmp_path):
    """TFMA as the oracle: its metrics, run by its own Beam pipeline (model-agnostic: the candidate's
    predictions written into the examples), on the same examples and slices."""
    import tensorflow_model_analysis as tfma
    from google.protobuf import text_format
    from tensorflow_model_analysis.proto import config_pb2

    config = EvaluatorConfig(slicing_specs=[SlicingSpec(feature_keys=["island"]), SlicingSpec(feature_keys=["island", "sex"]),
                                            SlicingSpec(feature_keys=["year"])], batch_size=256)
    ours = {s["slice"]: s for s in _decide(models, config, "off").slices_json()["slices"]}
    data = str(tmp_path / "predicted.tfrecord")
    predict = tf.saved_model.load(models["off"]).signatures["predict"]
    with tf.io.TFRecordWriter(data) as writer:
        for batch in tf.data.TFRecordDataset(models["split"], "GZIP").batch(500):
            out = predict(inputs=batch)
            for record, scores, mass in zip(batch.numpy(), out["species_scores"].numpy(), out["body_mass_g_outputs"].numpy()):
                e = tf.train.Example.FromString(record)
                label = SPECIES.index(e.features.feature["species"].bytes_list.value[0].decode())
                e.features.feature["species_label"].int64_list.value.append(label)
                e.features.feature["species_pred"].float_list.value.extend(scores.tolist())
                e.features.feature["mass_pred"].float_list.value.extend(mass.tolist())
                writer.write(e.SerializeToString())
    eval_config = text_format.Parse("""
        model_specs { label_keys { key: "species" value: "species_label" } label_keys { key: "mass" value: "body_mass_g" }
                      prediction_keys { key: "species" value: "species_pred" } prediction_keys { key: "mass" value: "mass_pred" } }
        slicing_specs {} slicing_specs { feature_keys: "island" } slicing_specs { feature_keys: ["island", "sex"] }
        slicing_specs { feature_keys: "year" }
        metrics_specs { output_names: "species" metrics { class_name: "ExampleCount" }
                        metrics { class_name: "MultiClassConfusionMatrixPlot" } }
        metrics_specs { output_names: "species" binarize { class_ids { values: [0, 1, 2] } }
                        metrics { class_name: "AUC" config: '"num_thresholds": 1001' } }
        metrics_specs { output_names: "mass" metrics { class_name: "MeanAbsoluteError" } metrics { class_name: "MeanSquaredError" } }
        """, config_pb2.EvalConfig())
    result = tfma.run_model_analysis(eval_config=eval_config, data_location=data, output_path=str(tmp_path / "tfma"))

    def name(key) -> str:
        return ",".join(f"{c}={v.decode() if isinstance(v, bytes) else v}" for c, v in key) or "Overall"

    theirs = {name(k): m for k, m in result.slicing_metrics}
    assert set(theirs) == set(ours) and len(ours) == 1 + 3 + 6 + 3
    for slice_, metrics in theirs.items():
        figures = ours[slice_]["candidate"]
        assert ours[slice_]["examples"] == metrics["species"][""]["example_count"]["doubleValue"], slice_
        mass = metrics["mass"][""]
        assert figures["body_mass_g_mae"] == pytest.approx(mass["mean_absolute_error"]["doubleValue"], rel=1e-6), slice_
        assert figures["body_mass_g_rmse"] ** 2 == pytest.approx(mass["mean_squared_error"]["doubleValue"], rel=1e-6), slice_
        # TFMA's AUC per class (binarized, 1001 thresholds: ours are the same ones); ours is their mean.
        per_class = [metrics["species"][f"classId:{c}"]["auc"]["doubleValue"] for c in range(3)]
        assert figures["species_auc"] == pytest.approx(np.mean(per_class), abs=1e-9), slice_
    for key, plots in result.plots:
        matrix = np.zeros((3, 3), int)
        for entry in plots["species"][""]["multiClassConfusionMatrixAtThresholds"]["matrices"][0]["entries"]:
            matrix[entry.get("actualClassId", 0), entry.get("predictedClassId", 0)] += entry.get("numWeightedExamples", 0)
        assert ours[name(key)]["confusion"]["species"]["matrix"] == matrix.tolist(), name(key)
        assert ours[name(key)]["candidate"]["species_accuracy"] == pytest.approx(np.trace(matrix) / matrix.sum(), abs=1e-12)


@pytest.mark.slow
def test_the_pipelines_evaluator_writes_slices_and_tfmas_result(pipeline_run):
    import glob

    import tensorflow_model_analysis as tfma

    from trainer.slicing import SLICES_JSON, TFMA_FOLDER

    config, summary = pipeline_run
    [folder] = [os.path.dirname(p) for p in glob.glob(os.path.join(config.pipeline.root, "tfx", "Evaluator", "blessing", "*", "BLESSED"))]
    written = json.load(open(os.path.join(folder, SLICES_JSON)))
    overall = written["slices"][0]
    blessing = json.load(open(os.path.join(folder, "blessing.json")))
    assert overall["slice"] == "Overall" and overall["champion"] is None  # the first model
    assert overall["candidate"]["species_accuracy"] == pytest.approx(blessing["candidate"]["species_accuracy"], rel=1e-6)
    assert overall["examples"] == blessing["candidate"]["species_examples"]
    assert written["calibration"]["species"] and written["gates"] == []
    result = tfma.load_eval_result(os.path.join(folder, TFMA_FOLDER))
    [(key, metrics)] = result.slicing_metrics
    assert key == () and metrics["species"][""]["accuracy"]["doubleValue"] == pytest.approx(overall["candidate"]["species_accuracy"])


def test_slicing_columns_parsed_with_the_labels_or_alone_give_the_same_slices(models):
    from trainer.evaluation import example_batches
    from trainer.slicing import Slicer

    specs = [SlicingSpec(feature_keys=["island", "sex"]), SlicingSpec(feature_buckets={"body_mass_g": [4000]}),
             SlicingSpec(feature_keys=["year"], feature_values={"island": "Dream"})]
    slicer = Slicer.for_split(specs, models["split"])
    assert slicer.kinds == {"island": "string", "sex": "string", "body_mass_g": "float32", "year": "int64"}
    [(batch, parsed)] = list(example_batches(models["split"], 1000, {"species": "string", "body_mass_g": "float32"},
                                             slicing=slicer.kinds))
    def members(slices) -> dict:
        return {key: sorted(slices.rows[slices.segments == i].tolist()) for i, key in enumerate(slices.keys)}

    together, alone = members(slicer.batch(batch, parsed)), members(slicer.batch(batch))
    assert together == alone and len(together) == 1 + 6 + 2 + 3
    with pytest.raises(ValueError, match=r"\['colour'\] in none of the first"):
        Slicer.for_split([SlicingSpec(feature_keys=["colour"])], models["split"])


def test_the_tfma_result_is_written_where_the_cli_defers_tfma_s_import(models, tmp_path):
    """`loopline run` defers TensorFlow Model Analysis' package (pipeline.deferred_imports), whose
    __init__ is what loads its protos in order: the Evaluator's writer must load them itself."""
    import subprocess
    import sys

    import tensorflow_model_analysis as tfma

    from tests.conftest import REPO, subprocess_env
    from trainer.slicing import TFMA_FOLDER

    config = EvaluatorConfig(slicing_specs=[SlicingSpec(feature_keys=["island"])])
    decision = _decide(models, config)
    (tmp_path / "report.json").write_text(json.dumps(decision.slices, default=float))
    child = ("import json, sys\nfrom pipeline.deferred_imports import defer_unused_imports\ndefer_unused_imports()\n"
             "import tensorflow\nfrom components.tfma_result import write_eval_result\n"
             "from trainer.evaluator_config import EvaluatorConfig\n"
             "report = json.load(open(sys.argv[1]))\n"
             "write_eval_result(sys.argv[2], report, EvaluatorConfig.model_validate_json(sys.argv[3]), "
             "['species', 'body_mass_g'], 'candidate', None, 'eval')\n")
    result = subprocess.run([sys.executable, "-c", child, str(tmp_path / "report.json"), str(tmp_path / TFMA_FOLDER),
                             config.model_dump_json()], capture_output=True, text=True, env=subprocess_env(), cwd=REPO,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (("island", "Torgersen"),) in dict(tfma.load_eval_result(str(tmp_path / TFMA_FOLDER)).slicing_metrics)
