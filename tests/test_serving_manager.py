"""The version manager's own rules, without a model: version folders and the version policy
(wanted_versions), and GetModelStatus while a failing load is being recorded."""
import threading

import grpc
from tensorflow_serving.config import model_server_config_pb2

from serving import manager as manager_module
from serving.config import ServingConfig
from serving.manager import Failure, ModelManager
from serving.model_config import parse_version, version_folders
from serving.storage_source import aspired_versions, folder_fingerprint, wanted_versions


def _entry(**labels) -> model_server_config_pb2.ModelConfig:
    entry = model_server_config_pb2.ModelConfig(name="m", base_path="/root/m", model_platform="tensorflow")
    for label, version in labels.items():
        entry.version_labels[label] = version
    return entry


def test_wanted_versions_follows_the_version_policy():
    entry = _entry()
    assert wanted_versions(entry, [1, 2, 5]) == [5]  # TF Serving's default: the latest one
    entry.model_version_policy.latest.num_versions = 2
    assert wanted_versions(entry, [1, 2, 5]) == [2, 5]
    entry.model_version_policy.specific.versions.extend([1, 7])
    assert wanted_versions(entry, [1, 2, 5]) == [1]  # a specific version that is not there is not wanted
    entry.model_version_policy.all.SetInParent()
    assert wanted_versions(entry, [1, 2, 5]) == [1, 2, 5]
    assert wanted_versions(_entry(), []) == []


def test_wanted_versions_keeps_labelled_versions_that_exist():
    assert wanted_versions(_entry(stable=2, gone=9), [1, 2, 3]) == [2, 3]


def test_tf_serving_rules_aspire_by_policy_alone():
    """With TF Serving's rules labels do not keep a version loaded: only the policy decides."""
    assert wanted_versions(_entry(stable=2), [1, 2, 3], keep_labelled=False) == [3]


def test_a_failed_version_is_retried_only_once_its_files_change(tmp_path):
    for version in (1, 2):
        (tmp_path / str(version)).mkdir()
        (tmp_path / str(version) / "saved_model.pb").write_bytes(b"x")
    entry = _entry()
    entry.base_path = str(tmp_path)
    entry.model_version_policy.all.SetInParent()
    failed = {2: Failure(folder_fingerprint(str(tmp_path / "2")), grpc.StatusCode.UNKNOWN, "ValueError: broken")}
    assert aspired_versions(entry, failed) == {1: str(tmp_path / "1")}
    (tmp_path / "2" / "saved_model.pb").write_bytes(b"fixed")  # new files: tried again
    assert aspired_versions(entry, failed) == {1: str(tmp_path / "1"), 2: str(tmp_path / "2")}


def test_version_folders_are_read_as_tf_serving_reads_them(tmp_path):
    """file_system_storage_path_source.cc: a child whose name parses as a base-10 integer is that
    version, loaded from the folder as named; other names are not versions."""
    for name in ("00000123", "7", "007", "12x", "-3", "+4", " 5", "\u0663", "99999999999999999999", "1e3"):
        (tmp_path / name).mkdir()
    assert version_folders(str(tmp_path)) == {123: "00000123", 7: "7"}  # "007" and "7": the one sorting last
    entry = _entry()
    entry.base_path = str(tmp_path)
    assert aspired_versions(entry, {}) == {123: str(tmp_path / "00000123")}
    assert parse_version("\u0663") is None and "\u0663".isdigit()  # ARABIC-INDIC DIGIT THREE: not a version


class _PausingDict(dict):
    """A `failed` map whose first iteration pauses after one item until something is written to it
    (or, where the writer cannot get in, until a second has passed): the window in which a load
    failure recorded without the manager's lock changes the map under GetModelStatus."""

    def __init__(self, data):
        super().__init__(data)
        self.iterating, self.written, self.paused = threading.Event(), threading.Event(), False

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.written.set()

    def items(self):
        view = super().items()

        def walk():
            for n, item in enumerate(view):
                yield item
                if n == 0 and not self.paused:
                    self.paused = True
                    self.iterating.set()
                    self.written.wait(timeout=1)  # the outcome does not depend on this time

        return walk()


def test_status_during_a_failing_load_sees_a_consistent_map(tmp_path, monkeypatch):
    """A hook holds a failing load inside reconcile() while status() lists the versions: the
    failure must not be recorded under status() (it raised "dictionary changed size during
    iteration"); status() returns the versions as they were, and the next call sees the failure."""
    loading, status_iterating = threading.Event(), threading.Event()

    def refuse(name, version, path, *args, **kwargs):
        if version == 2:  # held until status() is part-way through the map
            loading.set()
            status_iterating.wait(timeout=30)
        raise ValueError(f"version {version} is broken")

    monkeypatch.setattr(manager_module, "load_servable", refuse)
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "saved_model.pb").write_bytes(b"x")
    config = model_server_config_pb2.ModelServerConfig()
    config.model_config_list.config.add(name="m", base_path=str(tmp_path / "m"), model_platform="tensorflow")
    manager = ModelManager(str(tmp_path), ServingConfig())
    manager.apply_config(config, from_network=False)
    unknown = grpc.StatusCode.UNKNOWN
    assert manager.status("m") == [(1, "END", unknown, "ValueError: version 1 is broken")]

    state = manager._models["m"]
    state.failed = paused = _PausingDict(state.failed)
    paused.iterating = status_iterating
    (tmp_path / "m" / "2").mkdir()
    (tmp_path / "m" / "2" / "saved_model.pb").write_bytes(b"x")
    worker = threading.Thread(target=manager.reconcile)
    worker.start()
    try:
        assert loading.wait(timeout=30)
        during = manager.status("m")
    finally:
        status_iterating.set()
        worker.join(timeout=30)
    assert during == [(1, "END", unknown, "ValueError: version 1 is broken")]
    assert manager.status("m") == [(1, "END", unknown, "ValueError: version 1 is broken"),
                                   (2, "END", unknown, "ValueError: version 2 is broken")]
