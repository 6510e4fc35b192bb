"""The Tuner step for loopline's own models (`tuner.enabled`, `tuner.search_space`): config errors
named before any work, trials scored on the validation rows (never the eval split), the time
budget, the cache key, and one pipeline run whose Trainer trains with the best values and whose
second run reuses the search. TFX's tuner_fn contract is in tests/test_tfx_dropin.py's run."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from tests.conftest import REPO, make_config

SPACE = "tuner.search_space={learning_rate: {min: 0.001, max: 0.03, sampling: log}, hparams.units: {values: [8, 24]}}"


@pytest.mark.parametrize("overrides, message", [
    (["tuner.enabled=true"], "tuner.search_space is empty"),
    (["tuner.enabled=true", "tuner.search_space={dropout: {values: [0.1]}}"], "tuner.search_space.dropout: not a key"),
    (["tuner.enabled=true", "tuner.search_space={batch_size: {min: 0, max: 64}}"],
     "tuner.search_space.batch_size: 0 is not a valid trainer.batch_size"),
    (["tuner.enabled=true", "tuner.search_space={learning_rate: {min: 0.1, max: 0.01}}"], "must be below max"),
    (["tuner.max_trial=3"], "unknown key 'tuner.max_trial'"),
])
def test_bad_tuner_config_is_one_line_naming_the_key(tmp_path, overrides, message):
    from pipeline.config import ConfigError

    with pytest.raises(ConfigError) as raised:
        make_config(tmp_path, *overrides)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_tuner_module_without_tuner_fn_or_a_run_fn_trainer_is_refused_before_any_work(tmp_path):
    from pipeline.config import ConfigError
    from pipeline.pipeline import create_pipeline

    penguin = REPO / "tests" / "data" / "tfx_penguin" / "penguin_utils_keras.py"
    no_tuner_fn = make_config(tmp_path, f"tuner.module_file={REPO / 'examples' / 'penguins' / 'model.py'}")
    with pytest.raises(ConfigError, match=r"tuner.module_file: .*model.py defines no tuner_fn\(fn_args\)"):
        create_pipeline(no_tuner_fn)
    with pytest.raises(ConfigError, match="tuner.module_file: no such file"):
        create_pipeline(make_config(tmp_path, f"tuner.module_file={tmp_path / 'gone.py'}"))
    run_fn_trainer = make_config(tmp_path, f"trainer.module_file={penguin}", "tuner.enabled=true", SPACE)
    with pytest.raises(ConfigError, match="tuner.enabled: trainer.module_file is a TFX module file"):
        create_pipeline(run_fn_trainer)
    assert not (tmp_path / "tfx").exists()


def test_values_land_on_trainer_keys_and_hparams():
    from trainer.config import TrainerConfig
    from trainer.tuning import TunerConfig, hyperparameters, with_values

    space = TunerConfig(enabled=True, search_space={"batch_size": {"min": 16, "max": 64, "step": 16},
                                                    "learning_rate": {"min": 1e-4, "max": 1e-2, "sampling": "log"},
                                                    "hparams.units": {"values": [8, 24]}}).search_space
    hp = hyperparameters(space)
    assert [type(p).__name__ for p in hp.space] == ["Int", "Float", "Choice"]
    tuned = with_values(TrainerConfig(hparams={"layers": 1}), {"batch_size": 48, "hparams.units": 24})
    assert (tuned.batch_size, tuned.hparams) == (48, {"layers": 1, "units": 24})


def _fake_training(calls: list):
    """trainer.loop.train's stand-in: records the files each trial reads, scores by learning rate."""
    def train(config, train_pattern, eval_pattern, label, **kwargs):
        calls.append((train_pattern, eval_pattern, config))
        return SimpleNamespace(metrics={"species_loss": abs(config.learning_rate - 0.01)})
    return train


def _train_split(tmp_path, rows: int = 300) -> str:
    """A GZIP TFRecord 'train split' of `rows` distinct examples."""
    import tensorflow as tf

    path = tmp_path / "Split-train" / "data.gz"
    path.parent.mkdir()
    with tf.io.TFRecordWriter(str(path), tf.io.TFRecordOptions(compression_type="GZIP")) as writer:
        for i in range(rows):
            example = tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[float(i)]))}))
            writer.write(example.SerializeToString())
    return str(path.parent / "*")


def test_trials_are_scored_on_the_validation_rows_never_the_eval_split(tmp_path, monkeypatch):
    """Each trial trains on the train split's rows the hold-out keeps and is scored on its held-out
    rows (the Trainer's hash); the best trial is the one with the best objective."""
    import tensorflow as tf

    import trainer.loop
    from trainer.config import TrainerConfig
    from trainer.holdout import held_out
    from trainer.tuning import TunerConfig, search

    calls = []
    monkeypatch.setattr(trainer.loop, "train", _fake_training(calls))
    pattern = _train_split(tmp_path)
    tuner = TunerConfig(enabled=True, algorithm="random", max_trials=3, trial_epochs=2,
                        search_space={"learning_rate": {"values": [0.001, 0.01, 0.03]}})
    searcher, clock = search(TrainerConfig(), tuner, pattern, "species", str(tmp_path / "work"))

    assert len(calls) == 3 and set(clock.seconds) == set(searcher.oracle.trials)
    records = [r.numpy() for r in tf.data.TFRecordDataset(tf.io.gfile.glob(pattern), compression_type="GZIP")]
    expected = {r for r, out in zip(records, held_out(tf.constant(records), 0.2).numpy()) if out}
    for train_file, eval_file, config in calls:
        assert "Split-eval" not in eval_file and config.epochs == 2 and config.validation_fraction == 0
        read = lambda f: {r.numpy() for r in tf.data.TFRecordDataset(f, compression_type="GZIP")}  # noqa: E731
        assert read(eval_file) == expected and read(train_file) == set(records) - expected
    assert searcher.get_best_hyperparameters(1)[0].values == {"learning_rate": 0.01}


def test_the_same_seed_proposes_the_same_trials(tmp_path, monkeypatch):
    """tuner.seed fixes the search: KerasTuner would read the default seed (0) as none and draw one."""
    import random

    import trainer.loop
    from trainer.config import TrainerConfig
    from trainer.tuning import TunerConfig, search

    def proposals(seed: int, run: str) -> list[float]:
        calls = []
        monkeypatch.setattr(trainer.loop, "train", _fake_training(calls))
        random.seed(run)  # whatever state the process's generator is in
        tuner = TunerConfig(enabled=True, algorithm="random", max_trials=3, seed=seed,
                            search_space={"learning_rate": {"min": 0.001, "max": 0.03}})
        search(TrainerConfig(), tuner, pattern, "species", str(tmp_path / f"work-{seed}-{run}"))
        return [config.learning_rate for _, _, config in calls]

    pattern = _train_split(tmp_path)
    assert proposals(0, "first") == proposals(0, "second")
    assert proposals(0, "first") != proposals(7, "first")


def test_the_time_budget_stops_new_trials_and_says_so(tmp_path, monkeypatch, caplog):
    import trainer.loop
    from trainer.config import TrainerConfig
    from trainer.tuning import TunerConfig, search

    calls = []
    monkeypatch.setattr(trainer.loop, "train", _fake_training(calls))
    tuner = TunerConfig(enabled=True, max_trials=5, time_budget_seconds=1e-6,
                        search_space={"learning_rate": {"min": 0.001, "max": 0.03}})
    with caplog.at_level(logging.WARNING, logger="loopline.tuner"):
        _, clock = search(TrainerConfig(), tuner, _train_split(tmp_path), "species", str(tmp_path / "work"))
    assert len(calls) == 1 and clock.stopped_by_budget  # one trial always runs
    assert "tuner.time_budget_seconds" in caplog.text


def _tuner_node(config):
    from pipeline.pipeline import create_pipeline

    return next(c for c in create_pipeline(config).components if c.id == "Tuner")


def test_the_cache_key_holds_the_space_and_the_module_files(tmp_path):
    """TFX's cache reuses a component whose inputs and exec properties are unchanged: the Tuner's
    hold the search space, the trainer's settings and the module files' digests."""
    module = tmp_path / "model.py"
    module.write_text((REPO / "examples" / "penguins" / "model.py").read_text())
    base = [f"trainer.module_file={module}", "tuner.enabled=true", SPACE]
    first = _tuner_node(make_config(tmp_path, *base)).exec_properties
    assert _tuner_node(make_config(tmp_path, *base)).exec_properties == first
    wider = SPACE.replace("[8, 24]", "[8, 24, 64]")
    assert _tuner_node(make_config(tmp_path, *base[:2], wider)).exec_properties["tuner_config"] != first["tuner_config"]
    module.write_text(module.read_text() + "\n# edited\n")
    assert _tuner_node(make_config(tmp_path, *base)).exec_properties["module_sha256"] != first["module_sha256"]


@pytest.mark.slow
def test_the_trainer_trains_with_the_best_values_and_a_rerun_reuses_the_search(tmp_path):
    """One pipeline run with loopline's search on the generic model (two short trials): the
    exported model's hidden layers have the best trial's width; the same run again is a cache hit."""
    import json

    import tensorflow as tf

    from pipeline.local_runner import run_local
    from pipeline.run_metadata import node_outputs, open_store

    config = make_config(tmp_path, "trainer.module_file=null", "trainer.epochs=2", "mlflow.enabled=false",
                         "tuner.enabled=true", "tuner.max_trials=2", SPACE)
    summary = run_local(config)
    assert summary.executions["Tuner"] == "COMPLETE" and summary.blessed
    _, outputs = node_outputs(open_store(config, read_only=True), summary.run_id, config.pipeline.name, "Tuner")
    best = json.loads(tf.io.gfile.GFile(f"{outputs['HyperParameters'].uri}/best_hyperparameters.txt").read())["values"]
    model = tf.saved_model.load(summary.pushed_path)
    widths = {v.shape[-1] for v in model.variables if "hidden_0" in v.name and "kernel" in v.name}
    assert widths == {best["hparams.units"]}  # the generic model's own width is 64

    again = run_local(config)
    assert again.executions["Tuner"] == "CACHED" and again.executions["Trainer"] == "CACHED"
