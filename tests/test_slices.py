"""The Evaluator's slices: figures per slice in the same pass, per-slice gates (the default guard
and TFMA's MetricThresholds), slices.json and TFMA's format, and TFMA as the oracle."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

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

    def __init__(self, p: float, scrambled: str | None):
        super().__init__()
        self.p, self.scrambled = p, scrambled

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
        return {"species_scores": scores, "body_mass_g_outputs": parsed["body_mass_g"][:, None]}


def _oracle_model(path, p: float = 0.6, scrambled: str | None = None) -> str:
    module = _Oracle(p, scrambled)
    tf.saved_model.save(module, str(path), signatures={"predict": module.predict})
    os.makedirs(os.path.join(path, "assets.extra"), exist_ok=True)
    with open(os.path.join(path, "assets.extra", "loopline_signature.json"), "w") as f:
        json.dump({"features": {}, "heads": [h.to_json() for h in HEADS], "layout": 2}, f)
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("slices")
    return {"champion": _oracle_model(root / "champion"), "scrambled": _oracle_model(root / "scrambled", scrambled="Torgersen"),
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
    assert [b["examples"] for b in calibration if b["examples"]] == [40, 960]  # 0.45 and 0.6 top scores
