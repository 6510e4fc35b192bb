"""Pushes never collide and an interrupted push leaves nothing a server loads or a gate trusts
(serving.push): two pushes wanting one number (clock pinned to one second) in one process on an
object store (ram://) and in two processes on a local root; pushes killed at each pause point."""
from __future__ import annotations

import os
import signal
import socket

import pytest
import tensorflow as tf

import tests.ram_filesystem  # noqa: F401 - ram:// listed like an object store
from serving import push
from serving.model_config import available_versions, labelled_or_latest_version
from tests.push_helpers import finished, small_saved_model, start_push, tree_hashes, wait_paused

PINNED = 1_800_000_000.0


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return small_saved_model(str(tmp_path_factory.mktemp("model") / "saved_model"))


@pytest.fixture
def pinned_clock(monkeypatch):
    monkeypatch.setattr(push, "clock", lambda: PINNED)


def numbered(base: str) -> list[str]:
    """What TF Serving takes for versions: every child whose name is a number (it does not look
    for saved_model.pb before trying to load)."""
    return sorted(n.rstrip("/") for n in tf.io.gfile.listdir(base) if n.rstrip("/").isdigit())


def test_two_pushes_in_one_second_on_an_object_store_get_increasing_versions(model, pinned_clock):
    base = "ram://push-same-second/serving/m"
    first, second = push.push_model(model, base), push.push_model(model, base)
    assert (first.version, second.version) == (int(PINNED), int(PINNED) + 1)
    for pushed in (first, second):
        assert tree_hashes(pushed.path) == tree_hashes(model)
    assert numbered(base) == [str(first.version), str(second.version)]
    assert sorted(tf.io.gfile.listdir(f"{base}/{push.CLAIMS}")) == [str(first.version), str(second.version)]
    assert not [n for n in tf.io.gfile.listdir(base) if n.startswith(push.TEMP_PREFIX)]


def test_versions_follow_the_highest_one_when_the_clock_is_behind(model, tmp_path, monkeypatch):
    base = str(tmp_path / "m")
    monkeypatch.setattr(push, "clock", lambda: PINNED + 100)
    ahead = push.push_model(model, base)  # a machine whose clock is 100 s ahead
    monkeypatch.setattr(push, "clock", lambda: PINNED)
    behind = push.push_model(model, base)
    assert behind.version == ahead.version + 1  # still the newest for TF Serving's `latest` policy


def test_two_processes_wanting_one_number_on_a_local_root(model, tmp_path):
    """Both children choose the same number (clock pinned), wait until both have, then rename at
    once: exactly one gets it, the other the next, and both folders hold the whole model."""
    base, signals = str(tmp_path / "serving" / "m"), tmp_path / "signals"
    signals.mkdir()
    children = [start_push(model, base, signals, stop_at="rename", pinned=PINNED) for _ in range(2)]
    wait_paused(signals, 2, children)
    (signals / "go").touch()
    results = [finished(child) for child in children]
    versions = sorted(r["version"] for r, _ in results)
    assert versions == [int(PINNED), int(PINNED) + 1]
    assert sum("was taken by another push" in err for _, err in results) == 1  # the race really happened
    for result, _ in results:
        assert tree_hashes(result["path"]) == tree_hashes(model)
    assert sorted(os.listdir(base)) == [str(v) for v in versions]  # no temporary folder left


@pytest.mark.parametrize("point", ["variables", "saved_model", "rename"])
def test_a_push_killed_leaves_no_version_and_the_next_push_cleans_up(model, tmp_path, point):
    root = str(tmp_path / "serving")
    base = f"{root}/m"
    champion = push.push_model(model, base)
    signals = tmp_path / "signals"
    signals.mkdir()
    child = start_push(model, base, signals, stop_at=point)
    wait_paused(signals, 1, [child])
    os.kill(child.pid, signal.SIGKILL)
    child.wait()

    # Not a version for TF Serving (numbered children), `loopline serve` and the Evaluator.
    assert numbered(base) == [str(champion.version)]
    assert available_versions(base) == [champion.version]
    assert labelled_or_latest_version(root, "m", "stable") == champion.path
    leftovers = [n for n in os.listdir(base) if n.startswith(push.TEMP_PREFIX)]
    assert len(leftovers) == 1
    left = tree_hashes(f"{base}/{leftovers[0]}")
    if point == "variables":  # stopped half way through the first variables file
        assert "saved_model.pb" not in left and any(f.startswith("variables/") for f in left)
        truncated = next(f for f in sorted(left) if f.startswith("variables/"))
        assert os.path.getsize(f"{base}/{leftovers[0]}/{truncated}") < os.path.getsize(f"{model}/{truncated}")
    if point == "saved_model":  # a truncated saved_model.pb, the file a gate would trust
        size = os.path.getsize(f"{base}/{leftovers[0]}/saved_model.pb")
        assert 0 < size < os.path.getsize(f"{model}/saved_model.pb")
    if point == "rename":
        assert left == tree_hashes(model)

    after = push.push_model(model, base)
    assert not [n for n in os.listdir(base) if n.startswith(push.TEMP_PREFIX)]
    assert available_versions(base) == [champion.version, after.version]
    assert tree_hashes(after.path) == tree_hashes(model)


class _Killed(BaseException):
    """Stops a push like a kill: no `except Exception` in the push catches it."""


def test_a_copy_interrupted_on_an_object_store_is_skipped_then_removed(model, monkeypatch):
    """On an object store the number is claimed before the copy under it: a push stopped there
    leaves a numbered folder without saved_model.pb. `loopline serve` and the Evaluator skip it;
    TF Serving would see a number (and fail to load it: said in docs/runs-and-pushes.md); the
    next push removes it and never uses the number again."""
    base = "ram://push-interrupted/serving/m"
    root = base.rsplit("/", 1)[0]
    champion = push.push_model(model, base)

    def stop(point):
        if point == "publish":
            raise _Killed()

    monkeypatch.setattr(push, "pause_hook", stop)
    with pytest.raises(_Killed):
        push.push_model(model, base)
    monkeypatch.setattr(push, "pause_hook", None)
    half = [n for n in numbered(base) if int(n) != champion.version]
    assert len(half) == 1 and not tf.io.gfile.exists(f"{base}/{half[0]}/saved_model.pb")
    assert available_versions(base) == [champion.version]
    assert labelled_or_latest_version(root, "m", "stable") == f"{base}/{champion.version}"

    after = push.push_model(model, base)
    assert numbered(base) == [str(champion.version), str(after.version)]
    assert after.version > int(half[0])
    assert tree_hashes(after.path) == tree_hashes(model)


def test_a_push_in_progress_elsewhere_is_not_a_leftover(model, tmp_path):
    """Liveness: a live process's temporary folder stays; another host's stays until it is stale."""
    base = str(tmp_path / "m")
    tf.io.gfile.makedirs(base)
    live = f"{int(PINNED)}-{os.getppid()}-00000000-{socket.gethostname()}"
    other_host_recent = f"{int(push.time.time())}-1-00000000-another-host"
    other_host_old = f"{int(push.time.time()) - push.STALE_AFTER_S - 60}-1-00000000-another-host"
    for push_id in (live, other_host_recent, other_host_old):
        tf.io.gfile.makedirs(f"{base}/{push.TEMP_PREFIX}{push_id}")
    removed = push.remove_leftovers(base)
    assert removed == [f"{base}/{push.TEMP_PREFIX}{other_host_old}"]


def test_a_push_that_fails_removes_its_temporary_folder(model, tmp_path, monkeypatch):
    base = str(tmp_path / "m")

    def disk_full(point):
        if point == "saved_model":
            raise OSError("No space left on device")

    monkeypatch.setattr(push, "pause_hook", disk_full)
    with pytest.raises(OSError, match="No space left"):
        push.push_model(model, base)
    assert os.listdir(base) == []
