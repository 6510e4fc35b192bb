"""Publishes a model into a TF Serving base path as a new version folder: pushes never collide,
and an interrupted push leaves nothing a server loads or a gate trusts.

The version is max(now in seconds, highest number taken + 1), so versions always increase and TF
Serving's `latest` policy serves the newest push even when the pushing machines' clocks differ.
The model (and its TFLite variant as model.tflite, when one is given) is first written under a
hidden temporary name beside the versions (`.push-<id>`, saved_model.pb last), then published
under its number:

- local filesystem: renamed. rename(2) is atomic and refuses a non-empty target, so of two pushes
  renaming to one number exactly one gets it and the other takes the next free number.
- object stores (gs://; ram:// in tests), where a rename is a copy: the number is claimed first
  with a create-only marker `.claims/<number>` (serving.create_only), then the files are copied
  under it, saved_model.pb last; a claimed or existing number means the next one.

Nothing is overwritten and nothing is skipped. Leftovers of pushes that died are removed by the
next push: temporary folders, and on object stores numbered folders whose copy did not finish
(no saved_model.pb yet; their claim stays, so the number is never used again). A push is dead
when its process is gone (same host), or, for a push from another host, when it started over
STALE_AFTER_S ago.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

import tensorflow as tf

from serving import create_only
from serving import signature_names as names

log = logging.getLogger("loopline.push")

SAVED_MODEL = "saved_model.pb"
TEMP_PREFIX = ".push-"
CLAIMS = ".claims"
STALE_AFTER_S = 3600
CHUNK_BYTES = 16 << 20

# Seconds since the epoch; tests pin it to make two pushes want the same number.
clock = time.time
# Called with "variables" (half way through the first variables file), "saved_model" (half way
# through saved_model.pb), "rename" (everything written and a number chosen, not yet published)
# and, on object stores, "publish" (copied under the number but for saved_model.pb): tests stop
# or kill a push there.
pause_hook = None

_active: set[str] = set()  # this process's pushes in progress
_active_lock = threading.Lock()


@dataclass
class Pushed:
    version: int
    path: str


def version_path(base: str, version: int) -> str:
    return f"{base.rstrip('/')}/{version}"


def claim_path(base: str, version: int) -> str:
    return f"{base.rstrip('/')}/{CLAIMS}/{version}"


def push_model(model_dir: str, base: str, tflite_model: str | None = None) -> Pushed:
    """Publishes the SavedModel in `model_dir` as the next version under `base`; `tflite_model`: a
    TFLite file published beside it as `model.tflite` (TF Serving's --prefer_tflite_model serves it)."""
    tf.io.gfile.makedirs(base)
    remove_leftovers(base)
    push_id = _new_push_id()
    temp = f"{base.rstrip('/')}/{TEMP_PREFIX}{push_id}"
    with _in_progress(push_id):
        try:
            if tflite_model:  # first: the folder is complete only once saved_model.pb is written
                _copy_file(tflite_model, f"{temp}/{names.TFLITE_MODEL_FILE}", None)
            _copy_tree(model_dir, temp)
            if create_only.is_local(base):
                version = _rename_to_free_number(temp, base)
            else:
                version = _claim_and_copy(temp, base, push_id)
        except Exception:
            if tf.io.gfile.exists(temp):
                _remove(temp, "the temporary folder of a push that failed")
            raise
    path = version_path(base, version)
    log.info("pushed %s as version %d: %s", model_dir, version, path)
    return Pushed(version, path)


def taken_numbers(base: str) -> set[int]:
    """Every number in use: version folders, complete or not, and claims."""
    numbers = {int(n.rstrip("/")) for n in _listdir(base) if n.rstrip("/").isdigit()}
    numbers |= {int(n) for n in _listdir(f"{base.rstrip('/')}/{CLAIMS}") if n.isdigit()}
    return numbers


def next_number(base: str) -> int:
    return max(int(clock()), max(taken_numbers(base), default=0) + 1)


def _rename_to_free_number(temp: str, base: str) -> int:
    number = next_number(base)
    _pause("rename")
    while True:
        target = version_path(base, number)
        try:
            # gfile checks for the target first; what settles a race is rename(2) itself, which
            # refuses a non-empty target.
            tf.io.gfile.rename(temp, target, overwrite=False)
            return number
        except tf.errors.OpError:
            if not tf.io.gfile.exists(target):
                raise
            log.info("version %d was taken by another push; trying the next number", number)
            number = max(number + 1, next_number(base))


def _claim_and_copy(temp: str, base: str, push_id: str) -> int:
    number = next_number(base)
    _pause("rename")
    owner = {"push": push_id, "time": clock()}
    while not create_only.create(claim_path(base, number), owner) or tf.io.gfile.exists(version_path(base, number)):
        log.info("version %d was taken by another push; trying the next number", number)
        number = max(number + 1, next_number(base))
    _copy_tree(temp, version_path(base, number), publishing=True)
    tf.io.gfile.rmtree(temp)
    return number


def _copy_tree(source: str, target: str, publishing: bool = False) -> None:
    """Copies a SavedModel folder, saved_model.pb last: a reader takes a folder holding it as
    complete. Pause points: into the temporary folder, half way through the first variables file
    and through saved_model.pb; when publishing by copy, before saved_model.pb."""
    files = []
    for folder, _, names in tf.io.gfile.walk(source):
        relative = folder.rstrip("/")[len(source.rstrip("/")):].strip("/")
        files += [f"{relative}/{name}" if relative else name for name in names]
    files.sort(key=lambda f: (f == SAVED_MODEL, f))
    first_variables = next((f for f in files if f.startswith("variables/")), None)
    for relative in files:
        point = None
        if publishing:
            if relative == SAVED_MODEL:
                _pause("publish")
        elif relative == SAVED_MODEL:
            point = "saved_model"
        elif relative == first_variables:
            point = "variables"
        _copy_file(f"{source.rstrip('/')}/{relative}", f"{target.rstrip('/')}/{relative}", point)


def _copy_file(source: str, target: str, pause_point: str | None) -> None:
    tf.io.gfile.makedirs(os.path.dirname(target))
    size = tf.io.gfile.stat(source).length
    with tf.io.gfile.GFile(source, "rb") as reader, tf.io.gfile.GFile(target, "wb") as writer:
        if pause_point:  # half the file first, so a push stopped here leaves a truncated file
            _copy_bytes(reader, writer, size // 2)
            writer.flush()
            _pause(pause_point)
        _copy_bytes(reader, writer, None)
        if size == 0:
            writer.write(b"")  # GFile creates the file on its first write


def _copy_bytes(reader, writer, count: int | None) -> None:
    while count is None or count > 0:
        chunk = reader.read(CHUNK_BYTES if count is None else min(CHUNK_BYTES, count))
        if not chunk:
            return
        writer.write(chunk)
        if count is not None:
            count -= len(chunk)


def _pause(point: str) -> None:
    if pause_hook is not None:
        pause_hook(point)


# -- who is pushing, and what a dead push left -------------------------------------------------

def _new_push_id() -> str:
    # Host last: host names may hold '-'.
    return f"{int(clock())}-{os.getpid()}-{uuid.uuid4().hex[:8]}-{socket.gethostname()}"


class _in_progress:
    def __init__(self, push_id: str):
        self.push_id = push_id

    def __enter__(self):
        with _active_lock:
            _active.add(self.push_id)

    def __exit__(self, *exc):
        with _active_lock:
            _active.discard(self.push_id)


def is_dead(push_id: str) -> bool:
    """Whether the push `push_id` can no longer finish."""
    try:
        started, pid, _, host = push_id.split("-", 3)
        started, pid = int(started), int(pid)
    except ValueError:
        return False  # not ours: left alone
    if host != socket.gethostname():
        return time.time() - started > STALE_AFTER_S
    if pid == os.getpid():
        with _active_lock:
            return push_id not in _active
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        return False
    return False


def remove_leftovers(base: str) -> list[str]:
    """Removes what dead pushes left under `base`; returns the removed paths (each one logged)."""
    removed = []
    for name in _listdir(base):
        name = name.rstrip("/")
        if name.startswith(TEMP_PREFIX) and is_dead(name[len(TEMP_PREFIX):]):
            removed.append(_remove(f"{base.rstrip('/')}/{name}", "the temporary folder of a push that died"))
    if not create_only.is_local(base):
        removed += _remove_unfinished_copies(base)
    return removed


def _remove_unfinished_copies(base: str) -> list[str]:
    """Object stores: numbered folders without saved_model.pb whose claiming push died. The claim
    stays: a server that saw the folder half copied may remember the number as failed."""
    removed = []
    for name in _listdir(f"{base.rstrip('/')}/{CLAIMS}"):
        folder = version_path(base, int(name)) if name.isdigit() else None
        if folder is None or not tf.io.gfile.exists(folder) or tf.io.gfile.exists(f"{folder}/{SAVED_MODEL}"):
            continue
        owner = create_only.read(claim_path(base, int(name))) or {}
        if is_dead(str(owner.get("push", ""))):
            removed.append(_remove(folder, "a copy a dead push did not finish (no saved_model.pb)"))
    return removed


def _remove(path: str, why: str) -> str:
    try:
        tf.io.gfile.rmtree(path)
    except tf.errors.NotFoundError:
        pass  # another push removed it first
    log.warning("removed %s: %s", path, why)
    return path


def _listdir(path: str) -> list[str]:
    try:
        return tf.io.gfile.listdir(path)
    except tf.errors.NotFoundError:
        return []
