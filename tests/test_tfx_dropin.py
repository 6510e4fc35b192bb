"""TFX's penguin example (tests/data/tfx_penguin/, unchanged) through loopline with config keys
only: its preprocessing_fn in loopline's Transform step, its run_fn as the Trainer, then loopline's
Evaluator (TFMA-style label_key and signature), push, baseline and `loopline serve`; one real
`loopline run` (a child process: the command's deferred imports included) shared by the tests; its
tuner_fn runs in a Tuner step (two trials) whose best hyperparameters the run_fn trains with."""
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import REPO, loopline_run_child, make_config

PENGUIN = REPO / "tests" / "data" / "tfx_penguin"
MODULE_FILE = PENGUIN / "penguin_utils_keras.py"
TUNER_TRIALS = 2
FEATURES = ["culmen_length_mm", "culmen_depth_mm", "flipper_length_mm", "body_mass_g"]


@pytest.fixture(scope="module")
def penguin_run(tmp_path_factory):
    """`loopline run` itself (a child process) on the penguin example's data and module file, with
    config keys only; yields (config, the run's summary read back from ML Metadata)."""
    root = tmp_path_factory.mktemp("tfx_penguin")
    overrides = [f"data.path={PENGUIN / 'data' / 'labelled' / 'penguins_processed.csv'}",
                 f"transform.module_file={MODULE_FILE}", f"trainer.module_file={MODULE_FILE}",
                 "trainer.train_steps=100", "trainer.eval_steps=5", f"tuner.module_file={MODULE_FILE}",
                 f"tuner.max_trials={TUNER_TRIALS}"]
    return loopline_run_child(root, *overrides)


def outputs_of(config, summary, node: str) -> dict:
    """A component's output artifacts in ML Metadata, by type name."""
    from pipeline.run_metadata import node_outputs, open_store

    state, outputs = node_outputs(open_store(config, read_only=True), summary.run_id, config.pipeline.name, node)
    assert state == "COMPLETE"
    return outputs


def read_examples(pattern: str, feature_spec: dict) -> dict:
    files = tf.io.gfile.glob(pattern)
    assert files, pattern
    records = tf.data.TFRecordDataset(files, compression_type="GZIP" if files[0].endswith(".gz") else None)
    return {name: np.concatenate([batch[name].numpy().reshape(-1) for batch in
                                  records.batch(1000).map(lambda r: tf.io.parse_example(r, feature_spec))])
            for name in feature_spec}


@pytest.mark.slow
def test_the_transform_graph_and_transformed_examples_are_in_ml_metadata(penguin_run):
    """preprocessing_fn's tft.scale_to_z_score was analyzed over the train split: its transformed
    train features have mean 0 and deviation 1 (the raw ones are in [0, 1]); the label is passed
    through; the eval split went through the same transform function (no skew)."""
    import tensorflow_transform as tft

    config, summary = penguin_run
    assert summary.executions["Transform"] == "COMPLETE"
    outputs = outputs_of(config, summary, "Transform")
    graph = tft.TFTransformOutput(outputs["TransformGraph"].uri)
    examples = outputs["Examples"]
    assert examples.properties["split_names"].string_value == '["train", "eval"]'
    spec = graph.transformed_feature_spec()
    assert set(spec) == {f"{name}_xf" for name in FEATURES + ["species"]}

    train = read_examples(f"{examples.uri}/Split-train/transformed_examples-*.gz", spec)
    raw_train = read_examples(f"{config.pipeline.root}/tfx/CsvExampleGen/examples/*/Split-train/*",
                              graph.raw_feature_spec())
    for name in FEATURES:
        assert raw_train[name].mean() > 0.2  # raw: scaled to [0, 1] upstream
        assert abs(train[f"{name}_xf"].mean()) < 1e-4 and abs(train[f"{name}_xf"].std() - 1) < 1e-3
    np.testing.assert_array_equal(np.sort(train["species_xf"]), np.sort(raw_train["species"]))

    raw_eval = read_examples(f"{config.pipeline.root}/tfx/CsvExampleGen/examples/*/Split-eval/*",
                             graph.raw_feature_spec())
    by_graph = graph.transform_raw_features({k: tf.constant(v.reshape(-1, 1)) for k, v in raw_eval.items()})
    written = read_examples(f"{examples.uri}/Split-eval/transformed_examples-*.gz", spec)
    for name in FEATURES:
        np.testing.assert_allclose(np.sort(written[f"{name}_xf"]), np.sort(by_graph[f"{name}_xf"].numpy().reshape(-1)),
                                   rtol=1e-5)


def eval_split(config, feature_spec: dict) -> tuple[list[bytes], dict]:
    """ExampleGen's raw eval examples, serialized, and their parsed columns."""
    pattern = f"{config.pipeline.root}/tfx/CsvExampleGen/examples/*/Split-eval/*"
    records = [r.numpy() for r in tf.data.TFRecordDataset(tf.io.gfile.glob(pattern), compression_type="GZIP")]
    return records, read_examples(pattern, feature_spec)


@pytest.mark.slow
def test_the_penguin_run_fn_is_trained_evaluated_blessed_and_pushed(penguin_run):
    """run_fn, unchanged, trained through a real FnArgs; its serving signature takes raw
    tf.Examples (the transform graph inside); the Evaluator's accuracy is the pushed model's own
    on the eval split, and the model beat the trivial one."""
    config, summary = penguin_run
    assert {k: summary.executions[k] for k in ("Trainer", "Evaluator", "Pusher")} == dict.fromkeys(
        ("Trainer", "Evaluator", "Pusher"), "COMPLETE")
    assert summary.blessed is True
    assert any(r.startswith("species_loss ") and "for the trivial model" in r for r in summary.blessing_reasons)

    records, raw = eval_split(config, {"species": tf.io.FixedLenFeature([], tf.int64)})
    serve = tf.saved_model.load(summary.pushed_path).signatures["serving_default"]
    logits = serve(examples=tf.constant(records))["outputs"].numpy()
    accuracy = float(np.mean(logits.argmax(axis=1) == raw["species"]))
    # Seeded by tuner.seed and trainer.seed (TFX seeds neither): unseeded, the tuned model's
    # accuracy varied from run to run, 0.33 to 0.96 seen.
    majority = np.bincount(raw["species"]).max() / len(raw["species"])
    assert majority < 0.5 and accuracy > majority + 0.15
    # Whether the SavedModel runs in a TF1 Session (TF Serving's way) is recorded on the Model as a
    # fresh check finds it.
    model = outputs_of(config, summary, "Trainer")["Model"]
    recorded = model.custom_properties["session_problem"].string_value if "session_problem" in model.custom_properties else None
    from trainer.session_check import session_problem
    fresh = session_problem(summary.pushed_path)  # the variable it names first may differ
    assert (recorded is None) == (fresh is None), (recorded, fresh)
    blessing = outputs_of(config, summary, "Evaluator")["ModelBlessing"]
    assert blessing.custom_properties["eval_species_accuracy"].double_value == pytest.approx(accuracy, abs=1e-6)
    # The loss is the model's logits read as logits (a softmax taken), not as probabilities.
    expected_loss = float(np.mean(tf.keras.losses.sparse_categorical_crossentropy(raw["species"], logits,
                                                                                  from_logits=True)))
    assert blessing.custom_properties["eval_species_loss"].double_value == pytest.approx(expected_loss, rel=1e-4)


@pytest.mark.slow
def test_the_served_model_answers_raw_examples_over_grpc_as_the_saved_model_does(penguin_run):
    """`loopline serve` on the run's root: Predict with raw tf.Examples (the eval split's) answers
    the logits the pushed SavedModel gives when called directly."""
    from tests.serving_helpers import predict_examples

    config, summary = penguin_run
    records, _ = eval_split(config, {"species": tf.io.FixedLenFeature([], tf.int64)})
    direct = tf.saved_model.load(summary.pushed_path).signatures["serving_default"](examples=tf.constant(records))
    answer = predict_examples(Path(config.pipeline.root), config.serving.model_name, records)
    assert answer.model_spec.version.value == int(summary.version)
    np.testing.assert_allclose(tf.make_ndarray(answer.outputs["outputs"]), direct["outputs"].numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_the_fit_in_run_fn_is_tracked_in_mlflow(penguin_run):
    """run_fn's fit() wrote TensorBoard logs into model_run_dir: its epoch metrics are in the
    Trainer's MLflow run (Keras' names) and the logs among its artifacts; the eval-split metrics
    are the Model's. The Registrar continues that run and registers the pushed model."""
    from mlflow.tracking import MlflowClient

    config, summary = penguin_run
    assert summary.executions["Registrar"] == "COMPLETE"
    client = MlflowClient(f"sqlite:///{config.pipeline.root}/mlflow/mlflow.db")
    experiment = client.get_experiment_by_name(config.mlflow.experiment)
    (run,) = [r for r in client.search_runs([experiment.experiment_id]) if "mlflow.parentRunId" not in r.data.tags]
    assert run.info.status == "FINISHED"
    assert set(run.data.metrics) >= {"loss", "sparse_categorical_accuracy", "val_loss", "val_sparse_categorical_accuracy"}
    assert run.data.metrics["val_loss"] == pytest.approx(summary.metrics["loss"], abs=1e-6)  # the summary rounds
    assert summary.metrics["steps"] == config.trainer.train_steps  # one epoch of steps_per_epoch=train_steps
    assert 0 < run.data.metrics["loss"] < 1.1  # cross-entropy of 3 classes after 100 steps: below chance's 1.1
    logged = [a.path for a in client.list_artifacts(run.info.run_id, "trainer")]
    assert {"trainer/train", "trainer/validation"} <= set(logged)
    (version,) = client.search_model_versions(f"name='{config.mlflow.registered_model or config.serving.model_name}'")
    assert version.run_id == run.info.run_id


@pytest.mark.slow
def test_the_tuner_fn_searched_and_the_run_fn_trained_with_the_best(penguin_run):
    """TFX's Tuner contract: tuner_fn's KerasTuner searched tuner.max_trials trials (its own
    max_trials is 6); best_hyperparameters.txt is HyperParameters.get_config() as TFX's Tuner
    writes it; the Trainer's run_fn got it (its values are the Trainer run's tuned.* parameters);
    each trial is an MLflow run nested under the search's, itself under the Trainer's."""
    import json

    import keras_tuner
    from mlflow.tracking import MlflowClient

    config, summary = penguin_run
    assert summary.executions["Tuner"] == "COMPLETE"
    outputs = outputs_of(config, summary, "Tuner")
    text = tf.io.gfile.GFile(f"{outputs['HyperParameters'].uri}/best_hyperparameters.txt").read()
    best = keras_tuner.HyperParameters.from_config(json.loads(text))
    assert best.values["learning_rate"] in (1e-2, 1e-3) and 1 <= best.values["num_layers"] <= 3
    results = json.loads(tf.io.gfile.GFile(f"{outputs['TunerResults'].uri}/tuner_results.json").read())
    assert len(results) == TUNER_TRIALS and results[0]["learning_rate"] == best.values["learning_rate"]
    assert not tf.io.gfile.exists(f"{outputs['TunerResults'].uri}/work")  # KerasTuner's files are gone

    client = MlflowClient(f"sqlite:///{config.pipeline.root}/mlflow/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name(config.mlflow.experiment).experiment_id])
    by_name = {r.info.run_name: r for r in runs}
    trainer = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    search = by_name["tuner"]
    assert search.data.tags["mlflow.parentRunId"] == trainer.info.run_id
    assert trainer.data.params["tuned.learning_rate"] == str(best.values["learning_rate"])
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == search.info.run_id]
    assert len(trials) == TUNER_TRIALS
    for trial in trials:
        assert set(trial.data.params) == {"learning_rate", "num_layers"}
        assert 0 <= trial.data.metrics["val_sparse_categorical_accuracy"] <= 1
        assert trial.data.metrics["trial_seconds"] > 0


@pytest.mark.slow
def test_fn_args_are_tfx_s_own(penguin_run):
    """The FnArgs a run_fn gets: the Transform's examples and graph, the schema, the steps and
    custom_config from the trainer keys, and a data accessor that reads the transformed splits."""
    from tfx.components.trainer.fn_args_utils import FnArgs
    from tfx.types import standard_artifacts

    from components.tfx_fn_args import trainer_fn_args
    from trainer.config import TrainerConfig

    config, summary = penguin_run
    transform = outputs_of(config, summary, "Transform")
    examples = standard_artifacts.Examples()
    examples.uri = transform["Examples"].uri
    examples.split_names = transform["Examples"].properties["split_names"].string_value
    graph = standard_artifacts.TransformGraph()
    graph.uri = transform["TransformGraph"].uri
    schema = standard_artifacts.Schema()
    schema.uri = outputs_of(config, summary, "SchemaGen")["Schema"].uri
    model, model_run = standard_artifacts.Model(), standard_artifacts.ModelRun()
    model.uri, model_run.uri = "model", "model_run"
    trainer = TrainerConfig(module_file=str(MODULE_FILE), train_steps=7, eval_steps=3, custom_config={"epochs": 2})

    fn_args = trainer_fn_args(examples, schema, graph, model, model_run, trainer)
    assert isinstance(fn_args, FnArgs)
    assert fn_args.train_files == [f"{examples.uri}/Split-train/*"] and fn_args.eval_files == [f"{examples.uri}/Split-eval/*"]
    assert (fn_args.train_steps, fn_args.eval_steps, fn_args.custom_config) == (7, 3, {"epochs": 2})
    assert fn_args.transform_output == fn_args.transform_graph_path == graph.uri
    assert fn_args.schema_path == f"{schema.uri}/schema.pbtxt"
    assert (fn_args.serving_model_dir, fn_args.model_run_dir) == ("model/Format-Serving", "model_run")
    assert fn_args.hyperparameters is None

    from tfx_bsl.public import tfxio
    import tensorflow_transform as tft

    dataset = fn_args.data_accessor.tf_dataset_factory(
        fn_args.train_files, tfxio.TensorFlowDatasetOptions(batch_size=5, label_key="species_xf"),
        tft.TFTransformOutput(graph.uri).transformed_metadata.schema)
    features, label = next(iter(dataset))
    assert set(features) == {f"{name}_xf" for name in FEATURES} and label.shape == (5, 1)


@pytest.mark.slow
def test_a_signature_the_model_lacks_is_named(penguin_run):
    from trainer.model_spec import model_spec_description

    config, summary = penguin_run
    pattern = f"{config.pipeline.root}/tfx/CsvExampleGen/examples/*/Split-eval/*"
    with pytest.raises(ValueError, match=r"has no signature 'predict' \(evaluator.signature_name; it has "
                                         r"\['serving_default', 'transform_features'\]\)"):
        model_spec_description(summary.pushed_path, "species", "predict", pattern)
    with pytest.raises(ValueError, match="evaluator.label_key 'kind' is in none of the first eval examples"):
        model_spec_description(summary.pushed_path, "kind", "serving_default", pattern)


def test_a_run_fn_module_is_told_from_a_loopline_module():
    from trainer.tfx_contract import defines_run_fn

    assert defines_run_fn(str(MODULE_FILE))
    assert not defines_run_fn(str(REPO / "examples" / "penguins" / "model.py"))
    assert not defines_run_fn(None)


def test_a_module_file_without_the_function_is_named(tmp_path):
    from components.tfx_module_file import ModuleFileError, module_function

    module = tmp_path / "no_preprocessing.py"
    module.write_text("from tfx import v1 as tfx\n\ndef run_fn(fn_args):\n    pass\n")
    with pytest.raises(ModuleFileError, match=r"no_preprocessing\.py: has no function 'preprocessing_fn'"):
        module_function(str(module), "preprocessing_fn")
    assert module_function(str(module), "tuner_fn", required=False) is None
    assert callable(module_function(str(module), "run_fn"))  # `from tfx import v1` imported without TFDV


def test_a_transform_module_file_missing_or_without_preprocessing_fn_is_refused_before_any_work(tmp_path):
    from pipeline.config import ConfigError
    from pipeline.pipeline import create_pipeline

    with pytest.raises(ConfigError, match=r"transform.module_file: no such file: .*missing\.py"):
        create_pipeline(make_config(tmp_path, f"transform.module_file={tmp_path / 'missing.py'}"))
    trainer_only = tmp_path / "trainer_only.py"
    trainer_only.write_text("def run_fn(fn_args):\n    pass\n")
    with pytest.raises(ConfigError, match=r"trainer_only\.py defines no preprocessing_fn\(inputs\)"):
        create_pipeline(make_config(tmp_path, f"transform.module_file={trainer_only}"))
    pipeline = create_pipeline(make_config(tmp_path, f"transform.module_file={MODULE_FILE}",
                                           f"trainer.module_file={MODULE_FILE}"))
    assert "Transform" in [c.id for c in pipeline.components]


def test_transform_module_file_is_a_path_relative_to_the_config():
    config = make_config(REPO / "unused", "transform.module_file=tests/data/tfx_penguin/penguin_utils_keras.py")
    assert config.transform.module_file == str(MODULE_FILE)
    assert make_config(REPO / "unused").transform.module_file is None  # off by default


def test_the_stand_in_for_tfx_extensions_leaves_autograph_working():
    """autograph reads every loaded module's __file__ (inspect.getmodule); the stand-in raised
    ImportError there, and a loopline module's Python `if` on a tensor was no longer converted."""
    import tensorflow as tf

    from components.tfx_module_file import import_tfx_v1

    import_tfx_v1()

    def weight(step):
        if step >= 3:
            return tf.constant(0.0)
        return tf.constant(1.0)

    traced = tf.function(weight, autograph=True)
    assert float(traced(tf.constant(5))) == 0.0 and float(traced(tf.constant(1))) == 1.0


@pytest.mark.slow
def test_the_label_may_come_from_a_preprocessing_signature_as_in_tfma(penguin_run):
    """TFMA's preprocessing_function_names: `species_xf`, which the Transform made and no raw
    example holds, is read from the model's `transform_features` signature. The penguin module
    passes the label through, so every figure equals the one read from the raw `species`."""
    from trainer.blessing import evaluate_and_decide
    from trainer.evaluator_config import EvaluatorConfig
    from trainer.model_spec import describe_model

    config, summary = penguin_run
    splits = f"{config.pipeline.root}/tfx/CsvExampleGen/examples/*/Split-"

    def evaluate(**keys):
        evaluator = EvaluatorConfig(compare_to_champion=False, **keys)
        return evaluate_and_decide(summary.pushed_path, f"{splits}eval/*", None, evaluator,
                                   train_pattern=f"{splits}train/*", describe=lambda path: describe_model(
                                       path, evaluator.label_key, evaluator.signature_name, f"{splits}eval/*",
                                       evaluator.preprocessing_function_names))

    raw = evaluate(label_key="species")
    transformed = evaluate(label_key="species_xf", preprocessing_function_names=["transform_features"])
    assert raw.candidate["species_accuracy"] > 0.6  # the eval split's majority class is under 0.5
    for metric in ("accuracy", "loss"):
        assert transformed.candidate[f"species_xf_{metric}"] == pytest.approx(raw.candidate[f"species_{metric}"], abs=1e-6)
        assert transformed.trivial[f"species_xf_{metric}"] == pytest.approx(raw.trivial[f"species_{metric}"], abs=1e-6)
    with pytest.raises(ValueError, match="evaluator.label_key 'species_xf' is in none of the first eval examples"):
        evaluate(label_key="species_xf")
    with pytest.raises(ValueError, match=r"has no signature 'transform' \(evaluator.preprocessing_function_names"):
        evaluate(label_key="species_xf", preprocessing_function_names=["transform"])


def test_what_a_module_prints_goes_to_the_log_with_only_a_progress_bar_s_last_state(caplog):
    """A run_fn's fit() (Keras 2's progress bar, redrawn with backspaces and carriage returns) and
    print() reach the run's log, not the console's component lines; of a bar, its final state."""
    import logging
    import sys

    import tf_keras

    from components.tfx_module_file import printed_to_log

    logger = logging.getLogger("loopline.trainer")
    with caplog.at_level(logging.INFO, logger="loopline.trainer"), printed_to_log(logger):
        print("epoch 1")
        bar = tf_keras.utils.Progbar(50, interval=0.0)
        for step in range(1, 51):
            bar.update(step, [("loss", 1.0 / step)])
        sys.stdout.write("no newline at the end")
    lines = [r.getMessage() for r in caplog.records if r.name == "loopline.trainer"]
    assert lines[0] == "epoch 1" and lines[-1] == "no newline at the end"
    (final,) = lines[1:-1]
    assert final.lstrip().startswith("50/50 [") and "loss:" in final and "\b" not in final and "\r" not in final
