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
    with pytest.raises(ModelConfigError, match="not a valid ModelServerConfig"):
        read_model_server_config(str(path))
