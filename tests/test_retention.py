"""Retention (serving.retention, run by the Pusher after each push): the newest
`serving.keep_versions` stay, and so does every version models.config names or an MLflow alias
points to; when MLflow cannot be asked, nothing is removed. The Pusher's executor is run as TFX
runs it (artifacts in, PushedModel out), against a real MLflow store."""
from __future__ import annotations

import json
import logging
import os

import pytest
from tensorflow_serving.config import model_server_config_pb2
from tfx.proto import pusher_pb2
from tfx.types import standard_artifacts
from google.protobuf import json_format

from components.pusher import PusherExecutor
from serving import push
from serving.config_writer import model_entry
from serving.model_config import available_versions, model_config_path, write_model_server_config
from serving.retention import removable
from tests.mlflow_server import free_port
from tests.push_helpers import small_saved_model, tree_hashes
from tracking.registration import TAG_SERVING_VERSION
from tracking.target import TrackingTarget, make_client


def test_removable_keeps_the_newest_and_the_protected():
    assert removable([1, 2, 3, 4, 5, 6], keep=2, protected={2}) == [1, 3, 4]
    assert removable([1, 2], keep=5, protected=set()) == []
    assert removable([3, 1, 2], keep=1, protected={1, 2, 3}) == []


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A Model artifact folder as the Trainer writes it (the SavedModel in Format-Serving)."""
    uri = tmp_path_factory.mktemp("trainer") / "model"
    small_saved_model(str(uri / "Format-Serving"))
    return str(uri)


def run_pusher(trained: str, serving_root: str, tmp_path, keep: int, tracking: str = "", blessed: int = 1):
    model = standard_artifacts.Model()
    model.uri = trained
    blessing = standard_artifacts.ModelBlessing()
    blessing.uri = str(tmp_path / "blessing")
    blessing.set_int_custom_property("blessed", blessed)
    pushed = standard_artifacts.PushedModel()
    pushed.uri = str(tmp_path / "pushed")
    destination = pusher_pb2.PushDestination(
        filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=f"{serving_root}/m"))
    PusherExecutor().Do({"model": [model], "model_blessing": [blessing]}, {"pushed_model": [pushed]}, {
        "push_destination": json_format.MessageToJson(destination), "keep_versions": keep,
        "tracking": tracking, "registered_model": "m"})
    return pushed


def push_seven(trained, serving_root, tmp_path, monkeypatch, keep, tracking=""):
    """Seven pushes one second apart; returns each push's PushedModel artifact."""
    results = []
    for second in range(7):
        monkeypatch.setattr(push, "clock", lambda s=second: 1_800_000_000 + s)
        results.append(run_pusher(trained, serving_root, tmp_path / f"push{second}", keep, tracking))
    return results


def test_pushed_model_records_the_folder_written(trained, tmp_path):
    serving_root = str(tmp_path / "serving")
    pushed = run_pusher(trained, serving_root, tmp_path, keep=5)
    version = pushed.get_string_custom_property("pushed_version")
    assert pushed.get_int_custom_property("pushed") == 1
    assert pushed.get_string_custom_property("pushed_destination") == f"{serving_root}/m/{version}"
    assert tree_hashes(f"{serving_root}/m/{version}") == tree_hashes(f"{trained}/Format-Serving")
    not_pushed = run_pusher(trained, serving_root, tmp_path / "again", keep=5, blessed=0)
    assert not_pushed.get_int_custom_property("pushed") == 0
    assert available_versions(f"{serving_root}/m") == [int(version)]


def test_keeps_the_newest_and_what_models_config_and_mlflow_aliases_name(trained, tmp_path, monkeypatch, caplog):
    serving_root = str(tmp_path / "serving")
    target = TrackingTarget(tracking_uri=f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    client = make_client(target)
    client.create_registered_model("m")
    # Registry version 1 was pushed as serving version ...001 and is the champion.
    client.create_model_version("m", f"file://{tmp_path}/logged", tags={TAG_SERVING_VERSION: "1800000001"})
    client.set_registered_model_alias("m", "champion", "1")
    # models.config pins ...002 with a label (what `loopline promote` writes).
    config = model_server_config_pb2.ModelServerConfig()
    config.model_config_list.config.append(model_entry(serving_root, "m"))
    config.model_config_list.config[0].version_labels["canary"] = 1800000002
    os.makedirs(serving_root)
    write_model_server_config(model_config_path(serving_root), config)

    caplog.set_level(logging.INFO, logger="loopline.retention")
    pushes = push_seven(trained, serving_root, tmp_path, monkeypatch, keep=3, tracking=target.to_json())
    kept = [1_800_000_001, 1_800_000_002, 1_800_000_004, 1_800_000_005, 1_800_000_006]
    assert available_versions(f"{serving_root}/m") == kept
    assert sorted(os.listdir(f"{serving_root}/m")) == [str(v) for v in kept]
    removed = sorted(int(r.getMessage().split()[3]) for r in caplog.records if "retention: removed version" in r.getMessage())
    assert removed == [1_800_000_000, 1_800_000_003]
    assert [p.get_string_custom_property("pushed_version") for p in pushes][-1] == "1800000006"


def test_nothing_is_removed_when_mlflow_cannot_be_asked(trained, tmp_path, monkeypatch, caplog):
    serving_root = str(tmp_path / "serving")
    down = TrackingTarget(tracking_uri=f"http://127.0.0.1:{free_port()}", http_retries=0, http_timeout_s=2)
    caplog.set_level(logging.WARNING, logger="loopline.retention")
    push_seven(trained, serving_root, tmp_path, monkeypatch, keep=3, tracking=down.to_json())
    assert len(available_versions(f"{serving_root}/m")) == 7
    assert any("no version removed" in r.getMessage() and "registry could not be asked" in r.getMessage()
               for r in caplog.records)


def test_without_mlflow_models_config_alone_protects(trained, tmp_path, monkeypatch):
    serving_root = str(tmp_path / "serving")
    push_seven(trained, serving_root, tmp_path, monkeypatch, keep=2)
    assert available_versions(f"{serving_root}/m") == [1_800_000_005, 1_800_000_006]


def test_keep_versions_below_num_versions_is_a_config_error():
    from pipeline.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"serving.keep_versions \(1\) must be at least serving.num_versions \(2\)"):
        load_config(None, ["serving.num_versions=2", "serving.keep_versions=1"])
    assert json.loads(load_config(None, []).serving.model_dump_json())["keep_versions"] == 5
