"""The config files written after a push, parsed back with the protos; the server refuses model
entries that point outside the serving root."""
import logging

import pytest
from tensorflow_serving.config import model_server_config_pb2

from serving.config import ServingConfig
from serving.config_writer import (
    BatchingParameters,
    MonitoringConfig,
    read_textproto,
    write_serving_configs,
)
from serving.errors import ServingError
from serving.manager import ModelManager
from serving.model_config import read_model_server_config, set_version_labels, write_model_server_config


def test_configs_parse_back_and_keep_labels(tmp_path):
    root = tmp_path / "serving"
    (root / "penguins" / "3").mkdir(parents=True)
    (root / "penguins" / "3" / "saved_model.pb").write_bytes(b"x")
    config = ServingConfig(num_versions=2, batching={"max_batch_size": 8, "batch_timeout_micros": 500})
    paths = write_serving_configs(str(root), config)

    models = read_model_server_config(paths["models.config"])
    (entry,) = models.model_config_list.config
    assert (entry.name, entry.model_platform) == ("penguins", "tensorflow")
    assert entry.base_path == str((root / "penguins").resolve())
    assert entry.model_version_policy.latest.num_versions == 2
    batching = read_textproto(paths["batching.config"], BatchingParameters)
    assert (batching.max_batch_size.value, batching.batch_timeout_micros.value) == (8, 500)
    monitoring = read_textproto(paths["monitoring.config"], MonitoringConfig)
    assert monitoring.prometheus_config.enable and monitoring.prometheus_config.path == "/monitoring/prometheus/metrics"

    # A later push keeps the labels `loopline promote` set.
    set_version_labels(paths["models.config"], "penguins", {"stable": 3})
    write_serving_configs(str(root), config)
    entry = read_model_server_config(paths["models.config"]).model_config_list.config[0]
    assert dict(entry.version_labels) == {"stable": 3}
    assert list(entry.model_version_policy.specific.versions) == [3]


def test_server_refuses_models_outside_the_serving_root(tmp_path, caplog):
    root = tmp_path / "serving"
    (tmp_path / "outside" / "1").mkdir(parents=True)
    (tmp_path / "outside" / "1" / "saved_model.pb").write_bytes(b"x")
    config = model_server_config_pb2.ModelServerConfig()
    config.model_config_list.config.add(name="escape", base_path=str(root / ".." / "outside"), model_platform="tensorflow")
    config.model_config_list.config.add(name="../outside", base_path=str(root / ".." / "outside"), model_platform="tensorflow")
    write_model_server_config(str(root / "models.config"), config)

    manager = ModelManager(str(root), ServingConfig())
    with caplog.at_level(logging.ERROR, logger="loopline.serving"):
        manager.start()
    manager.stop()
    # As TF Serving does with an invalid config, the whole config is refused, naming the problem.
    assert "models.config not applied: model escape" in caplog.text and "not inside the serving root" in caplog.text
    assert manager._models == {}
    del config.model_config_list.config[0]
    with pytest.raises(ServingError, match="not a plain name"):
        manager.apply_config(config)
    assert manager._models == {}


def test_configs_are_written_under_a_remote_root():
    """A pipeline root on an object store (gs://... on a cluster): the files go through tf.io.gfile.
    TensorFlow's in-memory filesystem (ram://) stands in for the bucket."""
    import tensorflow as tf

    root = "ram://loopline-config-test/serving"
    tf.io.gfile.makedirs(f"{root}/penguins/3")
    with tf.io.gfile.GFile(f"{root}/penguins/3/saved_model.pb", "wb") as f:
        f.write(b"x")
    paths = write_serving_configs(root, ServingConfig())
    entry = read_model_server_config(paths["models.config"]).model_config_list.config[0]
    assert entry.base_path == f"{root}/penguins"
    assert read_textproto(paths["monitoring.config"], MonitoringConfig).prometheus_config.enable
    set_version_labels(paths["models.config"], "penguins", {"stable": 3})
    write_serving_configs(root, ServingConfig())
    assert dict(read_model_server_config(paths["models.config"]).model_config_list.config[0].version_labels) == {"stable": 3}
