"""The storage-path source (TF Serving's FileSystemStoragePathSource, with ServerCore's config
file polling): watches models.config and each model's base path, and says which versions each
model aspires to under its version policy. It loads nothing: the manager (serving.manager) gets
the config through `on_config` and a tick through `on_poll`, and loads and unloads."""
from __future__ import annotations

import logging
import os
import threading
from typing import Callable

import tensorflow as tf
from tensorflow_serving.config import model_server_config_pb2

from serving.errors import ServingError
from serving.model_config import available_versions, read_model_server_config

log = logging.getLogger("loopline.serving")


def folder_fingerprint(path: str) -> tuple:
    """(newest modification time, total bytes) of a version's files, through tf.io.gfile: base
    paths may be on an object store."""
    newest, count = 0, 0
    for folder, _, files in tf.io.gfile.walk(path):
        for f in files:
            try:
                st = tf.io.gfile.stat(os.path.join(folder, f))
            except tf.errors.OpError:
                continue
            newest, count = max(newest, st.mtime_nsec), count + st.length
    return newest, count


def wanted_versions(entry: model_server_config_pb2.ModelConfig, available: list[int]) -> list[int]:
    policy = entry.model_version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        wanted = set(available)
    elif which == "specific":
        wanted = set(policy.specific.versions) & set(available)
    else:
        n = policy.latest.num_versions if which == "latest" and policy.latest.num_versions > 0 else 1
        wanted = set(available[-n:])
    # Labels only resolve to loaded versions, so labelled ones are kept loaded.
    wanted |= set(entry.version_labels.values()) & set(available)
    return sorted(wanted)


def aspired_versions(entry: model_server_config_pb2.ModelConfig, failed: dict[int, tuple[tuple, str]]) -> list[int]:
    """The versions on disk that the policy wants, less those whose broken files have not changed
    since they failed (`failed`: version -> (folder fingerprint, reason))."""
    base = entry.base_path
    available = []
    for v in available_versions(base):
        failure = failed.get(v)
        if failure and failure[0] == folder_fingerprint(os.path.join(base, str(v))):
            continue  # still the same broken files
        available.append(v)
    return wanted_versions(entry, available)


class StoragePathSource:
    """Polls `models_config` every `poll_seconds`: a changed file goes to `on_config`; otherwise
    `on_poll` runs (the manager looks for new versions)."""

    def __init__(self, models_config: str, on_config: Callable, on_poll: Callable[[], None], poll_seconds: float):
        self.models_config = models_config
        self.on_config, self.on_poll, self.poll_seconds = on_config, on_poll, poll_seconds
        self._config_stamp = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read_config_file(self, force: bool = False) -> None:
        try:
            st = os.stat(self.models_config)
        except FileNotFoundError:
            if self._config_stamp is None:
                log.warning("no %s yet; serving nothing until it appears", self.models_config)
                self._config_stamp = ()
            return
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._config_stamp and not force:
            return
        self._config_stamp = stamp
        try:
            server_config = read_model_server_config(self.models_config)
            self.on_config(server_config)
            log.info("models.config: serving %s", [m.name for m in server_config.model_config_list.config])
        except (ValueError, ServingError) as exc:
            log.error("models.config not applied: %s", getattr(exc, "message", exc))
            self.on_poll()

    def start(self) -> None:
        self.read_config_file(force=True)
        self._thread = threading.Thread(target=self._poll, name="version-poller", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                before = self._config_stamp
                self.read_config_file()
                if self._config_stamp == before:
                    self.on_poll()
            except Exception:  # noqa: BLE001 - the poller must survive anything
                log.exception("version poll failed")

    def stop(self) -> None:
        self._stop.set()
