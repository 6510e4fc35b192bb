import pytest
from tensorflow_serving.config import model_server_config_pb2

from serving.model_config import (
    ModelConfigError,
    model_config_path,
    read_model_server_config,
    safe_base_path,
    set_version_labels,
    write_model_server_config,
)


def make_versions(base, *versions):
    for v in versions:
        (base / str(v)).mkdir(parents=True)
        (base / str(v) / "saved_model.pb").write_bytes(b"x")


def test_labels_move_and_policy_follows(tmp_path):
    make_versions(tmp_path / "m", 1, 2, 3)
    config = model_server_config_pb2.ModelServerConfig()
    entry = config.model_config_list.config.add(name="m", base_path=str(tmp_path / "m"), model_platform="tensorflow")
    path = model_config_path(str(tmp_path))
    write_model_server_config(path, config)

    set_version_labels(path, "m", {"stable": 1, "canary": 3})
    set_version_labels(path, "m", {"stable": 2})
    entry = read_model_server_config(path).model_config_list.config[0]
    assert dict(entry.version_labels) == {"stable": 2, "canary": 3}
    assert list(entry.model_version_policy.specific.versions) == [2, 3]

    with pytest.raises(ModelConfigError, match=r"label 'stable' -> version 9, but versions on disk are \[1, 2, 3\]"):
        set_version_labels(path, "m", {"stable": 9})
    with pytest.raises(ModelConfigError, match="'other' is not in models.config"):
        set_version_labels(path, "other", {"stable": 1})


def test_names_cannot_escape_the_serving_root(tmp_path):
    assert safe_base_path(str(tmp_path), "m") == str((tmp_path / "m").resolve())
    for bad in ("../x", "..", "a/b", "/etc", ""):
        with pytest.raises(ModelConfigError):
            safe_base_path(str(tmp_path), bad)


def test_garbage_config_is_reported(tmp_path):
    path = tmp_path / "models.config"
    path.write_text("model_config_list { nope }")
    with pytest.raises(ModelConfigError, match="Error parsing text-format tensorflow.serving.ModelServerConfig"):
        read_model_server_config(str(path))


def test_remote_roots_work_through_gfile():
    """A cluster run pushes to gs:// or s3://; TensorFlow's ram:// filesystem stands in for them."""
    import tensorflow as tf

    from serving.model_config import available_versions, labelled_or_latest_version

    root = "ram://serving-root"
    for version in (3, 5):
        tf.io.gfile.makedirs(f"{root}/m/{version}")
        with tf.io.gfile.GFile(f"{root}/m/{version}/saved_model.pb", "w") as f:
            f.write("x")
    assert safe_base_path(root, "m") == f"{root}/m"
    with pytest.raises(ModelConfigError):
        safe_base_path(root, "../m")
    assert available_versions(f"{root}/m") == [3, 5]
    assert labelled_or_latest_version(root, "m", "stable") == f"{root}/m/5"

    config = model_server_config_pb2.ModelServerConfig()
    config.model_config_list.config.add(name="m", base_path=f"{root}/m", model_platform="tensorflow")
    write_model_server_config(model_config_path(root), config)
    set_version_labels(model_config_path(root), "m", {"stable": 3})
    assert read_model_server_config(model_config_path(root)).model_config_list.config[0].version_labels["stable"] == 3
    assert labelled_or_latest_version(root, "m", "stable") == f"{root}/m/3"
