"""Create-only markers (serving.create_only), the atomic step pushes and the models.config lock
use on object stores: on gs:// a generation precondition (against a stand-in client made from the
real client's API), locally O_EXCL, elsewhere check-then-verify."""
from __future__ import annotations

import inspect
import threading
import time

import pytest
from google.cloud import storage

import tests.ram_filesystem  # noqa: F401
from serving import config_writer, create_only
from tests.gcs_stub import StubBlob, StubBucket, StubClient


@pytest.fixture
def gcs(monkeypatch):
    client = StubClient()
    monkeypatch.setattr(create_only, "_gcs_client", client)
    return client


@pytest.mark.parametrize("stub, real, method", [
    (StubClient, storage.Client, "bucket"), (StubBucket, storage.Bucket, "blob"),
    (StubBlob, storage.Blob, "upload_from_string"), (StubBlob, storage.Blob, "download_as_bytes"),
    (StubBlob, storage.Blob, "delete")])
def test_the_stand_in_takes_the_real_clients_parameters(stub, real, method):
    assert list(inspect.signature(getattr(stub, method)).parameters) == \
        list(inspect.signature(getattr(real, method)).parameters)


def test_gcs_create_only_one_writer_wins(gcs):
    path = "gs://bucket/serving/m/.claims/7"
    assert create_only.create(path, {"push": "a"}) is True
    assert create_only.create(path, {"push": "b"}) is False
    assert create_only.read(path) == {"push": "a"}
    create_only.delete(path)
    assert create_only.read(path) is None
    assert create_only.create(path, {"push": "b"}) is True


def test_gcs_create_whose_answer_was_lost_is_still_ours(gcs):
    """The client retries a conditional upload after a lost answer; the retry then fails the
    precondition on the object the first attempt wrote. That object is ours."""
    gcs.lose_next_answer = True
    assert create_only.create("gs://bucket/x/.claims/8", {"push": "a"}) is True


@pytest.mark.parametrize("root", ["local", "ram://create-only"])
def test_create_only_elsewhere(root, tmp_path):
    path = f"{tmp_path if root == 'local' else root}/claims/9"
    assert create_only.create(path, {"push": "a"}) is True
    assert create_only.create(path, {"push": "b"}) is False
    assert create_only.read(path) == {"push": "a"}


def test_models_config_lock_on_an_object_store_is_held_then_taken_over_when_stale(gcs, monkeypatch):
    root = "gs://bucket/serving"
    entered = threading.Event()
    release = threading.Event()

    def hold():
        with config_writer.models_config_lock(root):
            entered.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    entered.wait(10)
    with pytest.raises(TimeoutError, match="held by"):
        with config_writer.models_config_lock(root, timeout_s=0.5):
            pass
    release.set()
    holder.join()
    with config_writer.models_config_lock(root, timeout_s=0.5):  # released: free again
        pass
    # A writer that died holding it: its marker is taken over once stale.
    create_only.create(f"{root}/{config_writer.MODELS_CONFIG_LOCK}",
                       {"host": "gone", "pid": 1, "time": time.time() - config_writer.STALE_LOCK_S - 1})
    with config_writer.models_config_lock(root, timeout_s=0.5):
        pass


def test_models_config_lock_on_a_local_root_waits_for_the_holder(tmp_path):
    order = []
    entered = threading.Event()

    def hold():
        with config_writer.models_config_lock(str(tmp_path)):
            entered.set()
            time.sleep(0.5)
            order.append("first done")

    holder = threading.Thread(target=hold)
    holder.start()
    entered.wait(10)
    with config_writer.models_config_lock(str(tmp_path)):
        order.append("second in")
    holder.join()
    assert order == ["first done", "second in"]
