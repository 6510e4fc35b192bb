"""`loopline promote` to a registry version whose serving folder retention removed: the registered
model is pushed again as a new serving version and the label follows it; when it cannot be, the
promotion stops with one line."""
from __future__ import annotations

import mlflow
import pytest
import tensorflow as tf

from serving.config import ServingConfig
from serving.config_writer import write_serving_configs
from serving.model_config import available_versions, find_model, model_config_path, read_model_server_config
from serving.push import push_model
from tests.push_helpers import small_saved_model, tree_hashes
from tracking.logged_model import PYFUNC_CODE, fluent_tracking_uri, register
from tracking.promotion import PromotionError, follow_in_serving, move_alias
from tracking.registration import TAG_SERVING_VERSION
from tracking.target import TrackingTarget, ensure_experiment, make_client

@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One embedded MLflow store for the module (creating one takes seconds)."""
    folder = tmp_path_factory.mktemp("mlflow")
    target = TrackingTarget(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    return target, make_client(target)


@pytest.fixture
def registry(store, tmp_path):
    """Version 1 of 'm' in a fresh experiment: the loopline pyfunc model around a SavedModel, pushed
    as a serving version whose folder retention removed after a newer push."""
    target = TrackingTarget(tracking_uri=store[0].tracking_uri, experiment=tmp_path.name,
                            artifact_location=(tmp_path / "artifacts").as_uri())
    client = store[1]
    run_id = client.create_run(ensure_experiment(client, target)).info.run_id
    saved_model = small_saved_model(str(tmp_path / "trained" / "Format-Serving"), seed=3)
    with fluent_tracking_uri(target.tracking_uri), mlflow.start_run(run_id=run_id):
        # As tracking.logged_model logs it, less the signature (this SavedModel has no loopline sidecar);
        # explicit requirements: MLflow would otherwise load the model in a subprocess to infer them.
        logged = mlflow.pyfunc.log_model(name="model", python_model=PYFUNC_CODE, artifacts={"saved_model": saved_model},
                                         pip_requirements=["tensorflow"])
    serving_root = str(tmp_path / "serving")
    old = push_model(saved_model, f"{serving_root}/m")
    name = tmp_path.name  # a registered model per test
    register(client, target.tracking_uri, logged.model_uri, name, run_id, {TAG_SERVING_VERSION: str(old.version)})
    newer = push_model(small_saved_model(str(tmp_path / "other"), seed=4), f"{serving_root}/m")
    write_serving_configs(serving_root, ServingConfig(model_name="m"))
    tf.io.gfile.rmtree(old.path)  # what retention does to an old, unprotected version
    return client, name, serving_root, saved_model, old.version, newer.version


def test_promote_pushes_a_removed_version_again(registry):
    client, name, serving_root, saved_model, old_version, newer_version = registry
    promotion = follow_in_serving(client, move_alias(client, name, "champion", "1"), model_config_path(serving_root),
                                  "m", "stable")
    new_version = promotion.serving_version
    assert promotion.removed_version == old_version
    assert available_versions(f"{serving_root}/m") == [newer_version, new_version]
    assert tree_hashes(f"{serving_root}/m/{new_version}") == tree_hashes(saved_model)
    entry = find_model(read_model_server_config(model_config_path(serving_root)), "m")
    assert entry.version_labels["stable"] == new_version
    assert client.get_model_version(name, "1").tags[TAG_SERVING_VERSION] == str(new_version)
    assert f"serving version {old_version} had been removed" in "\n".join(promotion.lines())


def test_promote_stops_with_one_line_when_the_model_cannot_be_pushed_again(registry, tmp_path):
    client, name, serving_root, _, old_version, newer_version = registry
    tf.io.gfile.rmtree(str(tmp_path / "artifacts"))  # the registered model's files are gone too
    with pytest.raises(PromotionError) as raised:
        follow_in_serving(client, move_alias(client, name, "champion", "1"), model_config_path(serving_root),
                          "m", "stable")
    message = str(raised.value)
    assert "\n" not in message
    assert f"its serving version {old_version} was removed" in message and "could not be pushed again" in message
    assert available_versions(f"{serving_root}/m") == [newer_version]
    assert "stable" not in find_model(read_model_server_config(model_config_path(serving_root)), "m").version_labels
