"""The config files written after a push, parsed back with the protos; the base paths a model
config may name (any from the operator's file, only allowed ones over the network)."""
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


def test_network_reloads_name_only_allowed_base_paths(tmp_path):
    """The operator's config file may name any absolute base path (as in TF Serving); a config sent
    over the network only paths under serving.allowed_base_paths (default: the serving root and the
    file's base paths), checked with links resolved, and one bad entry refuses it whole."""
    root = tmp_path / "serving"
    for name in ("inside", "elsewhere", "outside"):
        (tmp_path / name).mkdir()
    (root / "m").mkdir(parents=True)
    (root / "sneaky").symlink_to(tmp_path / "outside")
    config = model_server_config_pb2.ModelServerConfig()
    config.model_config_list.config.add(name="m", base_path=str(tmp_path / "elsewhere"), model_platform="tensorflow")
    write_model_server_config(str(root / "models.config"), config)

    manager = ModelManager(str(root), ServingConfig())
    manager.start()  # the file's base path, outside the serving root, is taken
    manager.stop()
    assert manager._models["m"].entry.base_path == str(tmp_path / "elsewhere")
    assert manager.allowed_base_paths() == [str(root.resolve()), str(tmp_path / "elsewhere")]

    def reload(*paths):
        request = model_server_config_pb2.ModelServerConfig()
        for i, path in enumerate(paths):
            request.model_config_list.config.add(name=f"m{i}", base_path=str(path), model_platform="tensorflow")
        manager.apply_config(request, from_network=True)

    reload(root / "m", tmp_path / "elsewhere" / "sub")  # under the root, under the file's path
    assert sorted(manager._models) == ["m0", "m1"]
    for bad in (tmp_path / "outside", root / "sneaky", root / ".." / "outside", tmp_path / "elsewhere-2"):
        with pytest.raises(ServingError, match="is not under serving.allowed_base_paths") as info:
            reload(root / "m", bad)
        assert info.value.code.name == "PERMISSION_DENIED"
        assert sorted(manager._models) == ["m0", "m1"]  # nothing of it applied

    # A reload adding a model whose versions all fail answers UNKNOWN (WaitUntilModelsAvailable).
    (tmp_path / "inside" / "broken" / "1").mkdir(parents=True)
    (tmp_path / "inside" / "broken" / "1" / "saved_model.pb").write_bytes(b"not a SavedModel")
    manager.config = ServingConfig(allowed_base_paths=[str(tmp_path / "inside")])
    broken = model_server_config_pb2.ModelServerConfig()
    broken.model_config_list.config.add(name="new", base_path=str(tmp_path / "inside" / "broken"), model_platform="tensorflow")
    with pytest.raises(ServingError, match=r"^1 model\(s\) did not become available: \{\{\{name: new version: 1\} due") as info:
        manager.apply_config(broken, from_network=True)
    assert info.value.code.name == "UNKNOWN"
    reload(tmp_path / "inside")
    with pytest.raises(ServingError, match="is not under"):
        reload(root / "m")
    manager.config = ServingConfig(allowed_base_paths=[])
    with pytest.raises(ServingError, match="turned off"):
        reload()


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


def test_allowed_base_paths_must_be_absolute():
    from pipeline.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"'serving.allowed_base_paths': .*'models' is not an absolute path or a URI"):
        load_config(None, ["serving.allowed_base_paths=[models]"])
    assert load_config(None, ["serving.allowed_base_paths=[/srv/models, gs://b/m]"]).serving.allowed_base_paths == [
        "/srv/models", "gs://b/m"]
