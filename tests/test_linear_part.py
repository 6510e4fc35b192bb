"""The generic model's linear part (trainer/linear_part.py): scikit-learn's linear model on the
encoded features and the log of the skewed ones, fitted on the trained rows, frozen through training."""
from __future__ import annotations

import keras
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression, Ridge

from tests.trainer_data import write_examples
from trainer import linear_part
from trainer.config import TrainerConfig
from trainer.export import export_model
from trainer.export_config import ExportConfig
from trainer.loop import train


def _table(folder, label: str, rows: int = 400, seed: int = 7) -> tuple[str, str, dict]:
    """income (log-normal: skewed, positive), age (normal), city (text), 10% of income missing;
    the label (yes/no, or a number: `amount`) depends on log(income)."""
    rng = np.random.default_rng(seed)
    columns = {}
    paths = []
    for split, n in (("train", rows), ("eval", rows // 2)):
        income = np.exp(rng.normal(3.0, 1.0, n)).astype(np.float32)
        age = rng.normal(40.0, 10.0, n).astype(np.float32)
        city = rng.choice(["north", "south", "east"], n).astype(object)
        score = np.log(income) - 3.0 + 0.05 * (age - 40.0) + (city == "north") + rng.normal(0, 0.5, n)
        income[rng.random(n) < 0.1] = np.nan
        data = {"income": income, "age": age, "city": city,
                label: (score * 10).astype(np.float32) if label == "amount"
                else np.where(score > 0.3, "yes", "no").astype(object)}
        (folder / split).mkdir(parents=True, exist_ok=True)
        paths.append(write_examples(folder / split / "data.gz", data))
        if split == "train":
            columns = data
    return paths[0], paths[1], columns


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return _table(tmp_path_factory.mktemp("linear"), "label")


def _matrix(data: dict, stats) -> np.ndarray:
    """The linear part's inputs rebuilt from the raw columns: each number's z-score (0 when
    missing) and missing indicator in name order, the text one-hot, then log(1 + income) standardized."""
    parts = []
    for name in ("age", "income"):
        x = data[name].astype(np.float64)
        mean, std = stats.numbers[name]
        parts += [np.where(np.isnan(x), 0.0, (x - mean) / std), np.isnan(x).astype(float)]
    parts += [(data["city"] == value).astype(float) for value in stats.strings["city"]]
    income = data["income"].astype(np.float64)
    logged = np.log1p(income[~np.isnan(income)])
    filled = np.log1p(np.where(np.isnan(income), stats.numbers["income"][0], income))
    parts.append((filled - logged.mean()) / logged.std())
    return np.stack(parts, axis=1)


@pytest.fixture(scope="module")
def trained(table):
    train_path, eval_path, _ = table
    return train(TrainerConfig(epochs=3, seed=1, validation_fraction=0.0), train_path, eval_path, "label")


def test_the_linear_part_is_scikit_learns_fit_and_stays_frozen(table, trained):
    data, result = table[2], trained
    frozen = result.model.get_layer("label_linear")
    assert not frozen.trainable and not any(v is frozen.kernel for v in result.model.trainable_variables)
    inputs = result.model.get_layer("linear_inputs")
    assert inputs.log_columns == [2]  # income's z-score (age's is column 0): skewed and positive; age is not
    expected = LogisticRegression(C=linear_part.PENALTY, max_iter=1000).fit(
        _matrix(data, result.stats), data["label"] == "yes")
    kernel, bias = frozen.get_weights()
    yes = result.heads[0].vocabulary.index("yes")
    # Three epochs of training later, still the fit: class "yes" against "no" at zero.
    np.testing.assert_allclose(kernel[:, yes], expected.coef_[0], atol=2e-3)
    np.testing.assert_allclose(bias[yes], expected.intercept_[0], atol=2e-3)
    assert not kernel[:, 1 - yes].any() and bias[1 - yes] == 0
    assert np.abs(expected.coef_[0][-1]) > 0.5  # the log column carries the signal it was added for
    network = result.model.get_layer("label_network").kernel.numpy()
    assert network.any()  # the network's layer trained from its zeros


def test_the_log_columns_convert_to_tflite_builtins_with_parity(table, trained, tmp_path):
    train_path, eval_path, _ = table
    config = ExportConfig(tflite_variants=["float32", "dynamic_range"], latency_runs=2)
    report = export_model(trained.model, trained.kinds, trained.heads, trained.metrics, str(tmp_path / "serving"),
                          str(tmp_path), train_path, eval_path, config, exported=trained.exported)
    assert [(v["variant"], v["passed"]) for v in report["tflite"]] == [("float32", True), ("dynamic_range", True)], \
        report["tflite"]


def test_a_regression_head_is_ridge_in_standardized_units(tmp_path):
    train_path, eval_path, data = _table(tmp_path, "amount")
    result = train(TrainerConfig(epochs=1, seed=1, validation_fraction=0.0), train_path, eval_path, "amount")
    head = result.heads[0]
    target = (data["amount"].astype(np.float64) - head.mean) / head.std
    expected = Ridge(alpha=1 / linear_part.PENALTY).fit(_matrix(data, result.stats), target)
    kernel, bias = result.model.get_layer("amount_linear").get_weights()
    np.testing.assert_allclose(kernel[:, 0], expected.coef_, atol=1e-3)
    np.testing.assert_allclose(bias[0], expected.intercept_, atol=1e-3)


def test_off_or_streamed_the_network_is_alone(table, caplog):
    train_path, eval_path, _ = table
    names = lambda result: {layer.name for layer in result.model.layers}  # noqa: E731
    off = train(TrainerConfig(epochs=1, seed=1, linear_part=False), train_path, eval_path, "label")
    assert not {"label_linear", "linear_inputs"} & names(off)
    caplog.set_level("INFO", logger="loopline.trainer")
    streamed = train(TrainerConfig(epochs=1, seed=1, input={"in_memory_mb": 0}), train_path, eval_path, "label")
    assert "label_linear" not in names(streamed)
    assert "no linear part (trainer.linear_part): the train split is streamed" in caplog.text


def test_which_columns_get_a_log():
    rng = np.random.default_rng(0)
    skewed, normal, negative = rng.lognormal(0, 1, 500), rng.normal(5, 1, 500), -rng.lognormal(0, 1, 500)
    columns = []
    for x in (skewed, normal, negative):
        columns += [(x - x.mean()) / x.std(), np.zeros_like(x)]
    encoded = np.stack(columns, axis=1)
    numbers = {name: (2 * i, x.mean(), x.std()) for i, (name, x) in enumerate(zip("abc", (skewed, normal, negative)))}
    layout = linear_part._log_layout(encoded, numbers)
    assert layout["log_columns"] == [0]
    np.testing.assert_allclose(layout["log_means"][0], np.log1p(skewed).mean(), rtol=1e-6)


def test_a_resumed_run_continues_exactly(table, tmp_path):
    """Fitted again on resume (the same rows: the same fit), restored from the checkpoint."""
    train_path, eval_path, _ = table
    config = TrainerConfig(epochs=2, seed=3, deterministic=True)
    straight = train(config, train_path, eval_path, "label")
    steps = straight.steps // 2  # stopped at the end of the first epoch, an evaluation the straight run makes too
    train(config.model_copy(update={"max_steps": steps}), train_path, eval_path, "label", work_dir=str(tmp_path))
    resumed = train(config, train_path, eval_path, "label", work_dir=str(tmp_path))
    assert resumed.exported == straight.exported and resumed.steps == straight.steps
    for a, b in zip(straight.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_wide_rows_are_fitted_on_fewer(monkeypatch, caplog):
    """Rows x encoded columns stay under MAX_VALUES: here 2 columns (x and its missing indicator)."""
    import tensorflow as tf

    from trainer.features import TabularEncoder
    from trainer.heads import CLASSIFICATION, Head

    x = np.random.default_rng(1).normal(size=(1000, 1)).astype(np.float32)
    columns = {"x": tf.constant(x), "y": tf.constant(np.where(x > 0, "b", "a").astype(object).astype(bytes))}
    head = Head("y", CLASSIFICATION, vocabulary=["a", "b"], label_dtype="string")
    monkeypatch.setattr(linear_part, "MAX_VALUES", 600)
    caplog.set_level("INFO", logger="loopline.trainer")
    part = linear_part.fit(TabularEncoder({"x": (0.0, 1.0)}, {}), columns, [head])
    assert "fitted on 300 trained rows" in caplog.text
    kernel, _ = part.weights["y"]
    assert kernel[0, 1] > 1 and not kernel[:, 0].any()  # class b's logit grows with x


def _shops(folder, rows: int = 600, seed: int = 3) -> tuple[str, str, dict]:
    """x (normal) and shop, a text column of 60 values (over MAX_ONE_HOT: a lookup the network
    embeds) whose own effect moves the label; the eval split has shops the train split lacks."""
    rng = np.random.default_rng(seed)
    effect = dict(zip([f"shop{i}" for i in range(70)], rng.normal(0, 1.5, 70)))
    paths, columns = [], {}
    for split, n, shops in (("train", rows, 60), ("eval", rows // 3, 70)):
        x = rng.normal(0, 1, n).astype(np.float32)
        shop = rng.choice([f"shop{i}" for i in range(shops)], n).astype(object)
        score = x + np.array([effect[s] for s in shop]) + rng.normal(0, 0.5, n)
        data = {"x": x, "shop": shop, "label": np.where(score > 0, "yes", "no").astype(object)}
        (folder / split).mkdir(parents=True, exist_ok=True)
        paths.append(write_examples(folder / split / "data.gz", data))
        columns = columns or data
    return paths[0], paths[1], columns


@pytest.fixture(scope="module")
def shops(tmp_path_factory):
    train_path, eval_path, data = _shops(tmp_path_factory.mktemp("shops"))
    return train_path, eval_path, data, train(TrainerConfig(epochs=2, seed=1, validation_fraction=0.0), train_path,
                                              eval_path, "label")


def test_a_text_column_of_many_values_is_one_hot_in_the_fit(shops):
    """As scikit-learn's OneHotEncoder(handle_unknown="ignore") beside the numbers: the frozen
    table's rows are the fit's coefficients of each value, an unseen value's row is zero."""
    _, _, data, result = shops
    vocabulary = result.stats.lookups["shop"]
    assert len(vocabulary) == 60 and "shop" not in result.stats.strings  # looked up, not one-hot in the encoder
    mean, std = result.stats.numbers["x"]
    one_hot = (data["shop"][:, None] == np.array(vocabulary)[None, :]) * linear_part.ONE_HOT_SCALE
    matrix = np.column_stack([(data["x"] - mean) / std, np.zeros(len(data["x"])), one_hot])
    expected = LogisticRegression(C=linear_part.PENALTY, max_iter=1000).fit(matrix, data["label"] == "yes")
    yes = result.heads[0].vocabulary.index("yes")
    lookups = result.model.get_layer("label_linear_lookups")
    assert not lookups.trainable and not any(v is lookups.table for v in result.model.trainable_variables)
    table = lookups.get_weights()[0]
    assert table.shape == (61, 2) and not table[0].any()  # row 0: a missing or unseen shop adds nothing
    np.testing.assert_allclose(table[1:, yes] / linear_part.ONE_HOT_SCALE, expected.coef_[0][2:], atol=2e-3)
    kernel, bias = result.model.get_layer("label_linear").get_weights()
    np.testing.assert_allclose(kernel[:, yes], expected.coef_[0][:2], atol=2e-3)
    np.testing.assert_allclose(bias[yes], expected.intercept_[0], atol=2e-3)
    assert np.ptp(table[1:, yes]) > 1  # the shops' effects are in the linear part
    # The model reads each row's shop's row: the rows of an unseen shop (the eval split's last ten) read zero.
    rows = {"x": np.zeros((4, 1), np.float32), "shop": np.array([["shop0"], ["shop59"], ["shop65"], [""]], object)}
    reads = keras.Model(result.model.inputs, lookups.output)(rows).numpy()
    index = {value: i + 1 for i, value in enumerate(vocabulary)}
    np.testing.assert_allclose(reads[:2], table[[index["shop0"], index["shop59"]]], atol=1e-6)
    assert not reads[2:].any()


def test_the_lookup_logits_convert_to_tflite_with_parity(shops, tmp_path):
    train_path, eval_path, _, result = shops
    config = ExportConfig(tflite_variants=["float32"], latency_runs=2)
    report = export_model(result.model, result.kinds, result.heads, result.metrics, str(tmp_path / "serving"),
                          str(tmp_path), train_path, eval_path, config, exported=result.exported)
    assert [(v["variant"], v["passed"]) for v in report["tflite"]] == [("float32", True)], report["tflite"]
