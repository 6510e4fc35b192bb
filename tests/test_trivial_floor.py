"""The trivial floor: every head must beat the model that ignores the features (the train split's
class priors, or its mean), scored on the eval split with the head's own loss; a model trained on
shuffled labels is not blessed, and a floor that cannot be computed refuses."""
from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from tests.trainer_data import regression_splits, write_examples
from trainer.blessing import decide, evaluate_and_decide
from trainer.config import TrainerConfig
from trainer.evaluation import example_batches, label_kinds
from trainer.evaluator_config import EvaluatorConfig
from trainer.export import export_saved_model
from trainer.heads import CLASSIFICATION, REGRESSION, Head, HeadTotals
from trainer.loop import train
from trainer.trivial import Floor, Gain, TrivialModel


def _floor(heads, train_path, eval_path, candidate=None) -> TrivialModel:
    """The trivial model fitted on train_path and scored on eval_path, beside `candidate`'s outputs
    (by head name, one array over the eval rows) when given."""
    model = TrivialModel.fit(heads, example_batches(train_path, 3, label_kinds(heads)))
    start = 0
    for _, labels in example_batches(eval_path, 3, label_kinds(heads)):
        targets = {h.name: h.encode_label(tf.constant(labels[h.name])) for h in heads}
        rows = len(next(iter(labels.values())))
        losses = None
        if candidate:
            outputs = {name: tf.constant(v[start:start + rows]) for name, v in candidate.items()}
            losses = HeadTotals(heads).add(targets, outputs)  # the candidate's row losses, as the Evaluator has them
        model.score(targets, losses)
        start += rows
    return model


def test_the_trivial_model_is_the_train_priors_or_mean_scored_on_eval(tmp_path):
    species = Head("species", CLASSIFICATION, vocabulary=["a", "b", "c"])
    mass = Head("mass", REGRESSION, mean=0.0, std=2.0, label_dtype="float32")
    train_path = write_examples(tmp_path / "train.gz", {"species": np.array(["a", "a", "a", "b", "", "x"]),
                                                         "mass": np.array([1.0, 2.0, 3.0, np.nan, 6.0, 6.0])})
    eval_path = write_examples(tmp_path / "eval.gz", {"species": np.array(["a", "b", "c", "b", ""]),
                                                       "mass": np.array([0.0, 4.0, np.nan, 2.0, 2.0])})
    metrics = _floor([species, mass], train_path, eval_path).metrics()
    # Priors over the labelled known classes of the train split: a 3/4, b 1/4, c 0 (missing and unseen left out).
    # Eval: "c" has prior 0, so its loss is Keras' clipped -log(1e-7), as the candidate's would be.
    expected = (-math.log(0.75) - math.log(0.25) - math.log(1e-7) - math.log(0.25)) / 4
    assert metrics["species_loss"] == pytest.approx(expected, rel=1e-4)
    assert metrics["species_accuracy"] == pytest.approx(1 / 4)  # the majority class "a", once in 4
    assert metrics["species_examples"] == 4
    # Regression: the train mean of the labelled rows (18 / 5 = 3.6), squared errors in the head's std (2).
    errors = np.array([0.0, 4.0, 2.0, 2.0]) - 3.6
    assert metrics["mass_loss"] == pytest.approx(np.mean((errors / 2.0) ** 2), rel=1e-5)
    assert metrics["mass_rmse"] == pytest.approx(math.sqrt(np.mean(errors**2)), rel=1e-5)


def test_the_gain_over_the_trivial_model_is_taken_row_by_row(tmp_path):
    """Scored beside a candidate, the trivial model keeps each labelled row's loss gain: its mean is
    the difference of the two eval losses, its standard error the rows' sample deviation over root n."""
    species = Head("species", CLASSIFICATION, vocabulary=["a", "b"])
    mass = Head("mass", REGRESSION, mean=0.0, std=2.0, label_dtype="float32")
    train_path = write_examples(tmp_path / "train.gz", {"species": np.array(["a", "a", "a", "b"]),
                                                         "mass": np.array([1.0, 2.0, 3.0, 6.0])})
    eval_species, eval_mass = np.array(["a", "b", "", "a", "b", "a", "a"]), np.array([0.0, 4.0, np.nan, 2.0, 2.0, 5.0, 3.0])
    eval_path = write_examples(tmp_path / "eval.gz", {"species": eval_species, "mass": eval_mass})
    p_a = np.array([0.9, 0.2, 0.5, 0.6, 0.7, 0.8, 0.3], np.float32)
    candidate = {"species": np.stack([p_a, 1 - p_a], axis=1), "mass": np.array([[0.5], [3.0], [1.0], [2.5], [2.0], [4.0], [3.5]], np.float32)}
    gains = _floor([species, mass], train_path, eval_path, candidate).gains()
    labelled = eval_species != ""
    is_a = eval_species[labelled] == "a"
    trivial = -np.log(np.where(is_a, 0.75, 0.25))
    model = -np.log(np.where(is_a, p_a[labelled], 1 - p_a[labelled]))
    rows = np.isfinite(eval_mass)
    mass_gain = ((eval_mass[rows] - 3.0) ** 2 - (eval_mass[rows] - candidate["mass"][rows, 0]) ** 2) / 4.0
    for name, expected in (("species", trivial - model), ("mass", mass_gain)):
        assert gains[name].rows == expected.size == 6
        assert gains[name].mean == pytest.approx(expected.mean(), rel=1e-5)
        assert gains[name].standard_error == pytest.approx(expected.std(ddof=1) / math.sqrt(expected.size), rel=1e-4)


def _gate_floor(heads, candidate_loss: float, standard_error: float, rows: int = 1000) -> Floor:
    return Floor(heads, {"y_loss": 0.69, "y_accuracy": 0.6, "y_examples": float(rows)},
                 gains={"y": Gain(rows, 0.69 - candidate_loss, standard_error)})


def test_the_floor_gate_by_margin_beyond_chance_and_closed_when_it_cannot_check():
    heads = [Head("y", CLASSIFICATION, vocabulary=["a", "b"])]
    config = EvaluatorConfig()  # trivial_margin 0.01, trivial_confidence 0.95
    assert decide({"y_loss": 0.683, "y_accuracy": 0.7}, None, config, floor=_gate_floor(heads, 0.683, 0.004)).blessed  # 1.0% lower
    floor = _gate_floor(heads, 0.684, 0.001)
    refused = decide({"y_loss": 0.684, "y_accuracy": 0.7}, None, config, floor=floor)
    assert not refused.blessed and refused.failed[0].startswith("y_loss 0.684 vs 0.69 for the trivial model")
    assert "majority class's 0.6 (not gated)" in refused.failed[0]
    assert refused.trivial == floor.metrics
    # Past the margin, but no further than the eval rows' chance could take a model that learned nothing:
    # the gain's one-sided 95% bound (0.007 - 1.645 x 0.005) is below 0.
    chance = decide({"y_loss": 0.683, "y_accuracy": 0.7}, None, config, floor=_gate_floor(heads, 0.683, 0.005))
    assert not chance.blessed and "95% lower bound -0.00122, above 0 required" in chance.failed[0]
    off = EvaluatorConfig(trivial_confidence=0)
    assert decide({"y_loss": 0.683}, None, off, floor=_gate_floor(heads, 0.683, 0.005)).blessed
    with pytest.raises(ValueError, match="greater than or equal to 0.5"):  # a bound above the mean gain
        EvaluatorConfig(trivial_confidence=0.3)
    one_row = decide({"y_loss": 0.5}, None, config, floor=_gate_floor(heads, 0.5, math.nan, rows=1))
    assert "not beyond chance: 1 rows scored beside the trivial model, at least 2 required" in one_row.failed[0]
    no_gains = Floor(heads, {"y_loss": 0.69, "y_accuracy": 0.6, "y_examples": 10.0})
    assert not decide({"y_loss": 0.5}, None, config, floor=no_gains).blessed
    # Accuracy below the majority class's is not what refuses: the loss decides.
    assert decide({"y_loss": 0.5, "y_accuracy": 0.55}, None, config, floor=_gate_floor(heads, 0.5, 0.01)).blessed
    for candidate in ({"y_accuracy": 0.9}, {"y_loss": float("nan")}):
        assert not decide(candidate, None, config, floor=floor).blessed
    empty = Floor(heads, {"y_loss": 0.0, "y_accuracy": 0.0, "y_examples": 0.0})
    assert "no labelled eval rows" in decide({"y_loss": 0.1}, None, config, floor=empty).failed[0]
    broken = decide({"y_loss": 0.1}, None, config, floor=Floor(heads, problem="no train split to fit it on"))
    assert broken.failed == ["trivial floor not computed: no train split to fit it on"]
    headless = decide({}, None, config, floor=Floor())
    assert headless.blessed and "no trivial floor: no heads" in headless.reasons


def interaction_splits(folder, rows: int = 1024, features: int = 32, seed: int = 3) -> dict[str, str]:
    """label yes/no from x0 * x1 + 0.8 x2 + noise, among 32 numeric features: the train and eval
    splits, and the train split again with its labels permuted across rows ("shuffled": the class
    balance kept). A permutation of 1,024 labels keeps some chance correlation with each part of the
    true score (its standard deviation is 1/32), enough for a model to learn a little of the real
    signal from it; the first permutation under 0.01 with both x2 and x0 * x1 is taken, so that the
    shuffled labels carry nothing to learn."""
    rng = np.random.default_rng(seed)
    splits = {}
    for split in ("train", "eval"):
        x = rng.normal(size=(rows, features)).astype(np.float32)
        score = x[:, 0] * x[:, 1] + 0.8 * x[:, 2] + 0.5 * rng.normal(size=rows)
        splits[split] = (x, np.where(score > 0, "yes", "no"))
    x, labels = splits["train"]

    def chance_signal(y):
        return max(abs(np.corrcoef(part, y == "yes")[0, 1]) for part in (x[:, 2], x[:, 0] * x[:, 1]))

    permuted = (labels[np.random.default_rng(s).permutation(rows)] for s in range(1000))
    splits["shuffled"] = (x, next(y for y in permuted if chance_signal(y) < 0.01))
    paths = {}
    for name, (x, y) in splits.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        paths[name] = write_examples(folder / name / "data.gz", {f"x{i}": x[:, i] for i in range(features)} | {"label": y})
    return paths


def test_a_model_trained_on_shuffled_labels_is_not_blessed(tmp_path):
    """Trained by the trainer on labels shuffled across the train split, exported, and judged by the
    Evaluator's code against the trivial model fitted on that split: refused for the floor alone.
    The same model trained on the true labels is blessed."""
    label = "label"
    splits = interaction_splits(tmp_path / "data")
    decisions = {}
    for name in ("train", "shuffled"):
        result = train(TrainerConfig(epochs=4, seed=1), splits[name], splits["eval"], label)
        export_dir = export_saved_model(result.model, result.kinds, result.heads, str(tmp_path / name))
        decisions[name] = evaluate_and_decide(export_dir, splits["eval"], None, EvaluatorConfig(), train_pattern=splits[name])
    assert decisions["train"].blessed, decisions["train"].failed
    refused = decisions["shuffled"]
    assert not refused.blessed
    assert len(refused.failed) == 1 and "for the trivial model" in refused.failed[0], refused.failed
    # Shuffling keeps the labels' distribution: both were held to the same floor.
    assert refused.trivial[f"{label}_loss"] == pytest.approx(decisions["train"].trivial[f"{label}_loss"], rel=1e-6)


def test_without_a_train_split_the_floor_refuses(tmp_path):
    train_path, eval_path = regression_splits(tmp_path / "data", rows=128)
    result = train(TrainerConfig(epochs=1), train_path, eval_path, "target")
    export_dir = export_saved_model(result.model, result.kinds, result.heads, str(tmp_path / "model"))
    decision = evaluate_and_decide(export_dir, eval_path, None, EvaluatorConfig())
    assert decision.failed == ["trivial floor not computed: no train split to fit it on"]
    missing = evaluate_and_decide(export_dir, eval_path, None, EvaluatorConfig(), train_pattern=str(tmp_path / "none*"))
    assert not missing.blessed and missing.failed[0].startswith("trivial floor not computed:")


def test_the_trivial_model_from_the_train_statistics_is_the_one_fitted_on_the_labels(tmp_path):
    """Where the train split's statistics hold the labels exactly (a string label's rank histogram,
    a numeric label's mean over finite values), the Evaluator fits the trivial model from them instead
    of reading the split again: the same predictions, bit for bit. An infinite label, an integer
    label or a histogram that is not exact leaves the head to the read."""
    from trainer.blessing import _trivial_model
    from validation.statistics import compute_statistics, exact_value_counts, finite_mean

    species = Head("species", CLASSIFICATION, vocabulary=["a", "b", "c"])
    mass = Head("mass", REGRESSION, mean=0.0, std=2.0, label_dtype="float32")
    rng = np.random.default_rng(0)
    train_path = _with_int64_column(write_examples(tmp_path / "train.gz", {
        "species": np.array(["a", "a", "a", "b", "", "x"] * 50),
        "mass": np.where(rng.random(300) < 0.1, np.nan, rng.normal(4200.0, 800.0, 300))}),
        "count", rng.integers(2000, 7000, 300))
    stats = compute_statistics(train_path, "train")
    count = Head("count", REGRESSION, mean=0.0, std=1.0, label_dtype="int64")  # an integer label, e.g. grams
    heads = [species, mass, count]
    summaries = {"species": exact_value_counts(stats, "species"), "mass": finite_mean(stats, "mass"),
                 "count": finite_mean(stats, "count")}
    fitted = TrivialModel.fit(heads, example_batches(train_path, 7, label_kinds(heads)))
    from_stats = TrivialModel.from_label_summaries(heads, summaries)
    for name in ("species", "mass", "count"):
        np.testing.assert_array_equal(from_stats.predictions[name], fitted.predictions[name])
    assert exact_value_counts(stats, "count") is None and finite_mean(stats, "species") is None
    big = _with_int64_column(write_examples(tmp_path / "big.gz", {"x": np.array([0.0, 1.0])}), "count",
                             np.array([1, 2**25]))  # not every value a float32 exactly
    assert finite_mean(compute_statistics(big, "train"), "count") is None
    # With every head summarized, the train split is not read (here it is not there at all).
    model, floor = _trivial_model([species, mass], str(tmp_path / "missing*"), EvaluatorConfig(), summaries)
    assert floor.problem is None and model.predictions["species"].tolist() == [0.75, 0.25, 0.0]
    with_infinity = write_examples(tmp_path / "inf.gz", {"mass": np.array([1.0, np.inf, 3.0])})
    assert finite_mean(compute_statistics(with_infinity, "train"), "mass") is None


def _with_int64_column(path: str, name: str, values: np.ndarray) -> str:
    """Rewrites the records with an int64_list column added (write_examples writes numbers as floats)."""
    records = list(tf.data.TFRecordDataset(path, compression_type="GZIP").as_numpy_iterator())
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for record, value in zip(records, values):
            example = tf.train.Example.FromString(record)
            example.features.feature[name].int64_list.value.append(int(value))
            writer.write(example.SerializeToString(deterministic=True))
    return path
