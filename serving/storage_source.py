"""The storage-path source (TF Serving's FileSystemStoragePathSource, with the server's config file
polling): watches the ModelServerConfig file and each model's base path, and says which version
folders each model aspires to under its version policy. It loads nothing: the manager
(serving.manager) gets the config through `on_config` and a tick through `on_poll`, and loads and
unloads."""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

import tensorflow as tf
from tensorflow_serving.config import model_server_config_pb2

from serving.errors import ServingError, invalid, not_found
from serving.model_config import read_model_server_config, version_folders

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


def wanted_versions(entry: model_server_config_pb2.ModelConfig, available: list[int], keep_labelled: bool = True) -> list[int]:
    """The versions the policy aspires to (AspireLatestVersions, AspireAllVersions,
    AspireSpecificVersions); `keep_labelled` (loopline's rule) adds the labelled ones that exist."""
    policy = entry.model_version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        wanted = set(available)
    elif which == "specific":
        wanted = set(policy.specific.versions) & set(available)
    else:
        n = policy.latest.num_versions if which == "latest" and policy.latest.num_versions > 0 else 1
        wanted = set(sorted(available)[-n:])
    if keep_labelled:  # labels only resolve to loaded versions, so labelled ones are kept loaded
        wanted |= set(entry.version_labels.values()) & set(available)
    return sorted(wanted)


def aspired_versions(entry: model_server_config_pb2.ModelConfig, failed: dict, keep_labelled: bool = True) -> dict[int, str]:
    """{version: its folder} for the versions on disk the policy wants, less those whose files have
    not changed since they failed to load (`failed`: version -> (folder fingerprint, ...))."""
    base = entry.base_path
    available = {}
    for version, folder in version_folders(base).items():
        path = os.path.join(base, folder)
        failure = failed.get(version)
        if failure and failure[0] == folder_fingerprint(path):
            continue  # still the same broken files
        available[version] = path
    return {v: available[v] for v in wanted_versions(entry, list(available), keep_labelled)}


def _file_stamp(path: str) -> tuple | None:
    try:
        st = tf.io.gfile.stat(path)  # the config file may be on an object store too
    except tf.errors.OpError:
        return None
    return st.mtime_nsec, st.length


class StoragePathSource:
    """Reads the config (a file, or one given whole) and hands it to `on_config`; then re-reads a
    changed file every `config_poll_seconds` (0 or less: never) and calls `on_poll` (the manager
    looks for new versions) every `version_poll_seconds` (0: only at the start, below 0: never)."""

    def __init__(self, models_config: str | None, on_config: Callable, on_poll: Callable[[], None],
                 config_poll_seconds: float, version_poll_seconds: float,
                 model_config: model_server_config_pb2.ModelServerConfig | None = None):
        self.models_config, self.model_config = models_config, model_config
        self.on_config, self.on_poll = on_config, on_poll
        self.config_poll_seconds, self.version_poll_seconds = config_poll_seconds, version_poll_seconds
        self._config_stamp = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read_config_file(self, force: bool = False, strict: bool = False) -> None:
        """Applies the file when it changed. `strict`: a file that is missing or cannot be read or
        applied raises (a server started on it stops) instead of being logged."""
        stamp = _file_stamp(self.models_config)
        if stamp is None:
            if strict:
                raise not_found(f"{self.models_config}: no such file")
            if self._config_stamp is None:
                log.warning("no %s yet; serving nothing until it appears", self.models_config)
                self._config_stamp = ()
            return
        if stamp == self._config_stamp and not force:
            return
        self._config_stamp = stamp
        try:
            server_config = read_model_server_config(self.models_config)
        except ValueError as exc:
            if strict:  # ParseProtoTextFile's status, with the parser's words
                raise invalid(f"Invalid protobuf file: '{self.models_config}': {exc}") from None
            log.error("%s not applied: %s", self.models_config, exc)
            self.on_poll()
            return
        try:
            self.on_config(server_config)
            log.info("%s: serving %s", self.models_config, [m.name for m in server_config.model_config_list.config])
        except ServingError as exc:
            if strict:
                raise
            log.error("%s not applied: %s", self.models_config, exc.message)
            self.on_poll()

    def start(self, strict: bool = False) -> None:
        """Applies the config once (loading its models), then starts polling."""
        if self.model_config is not None:
            self.on_config(self.model_config)
        else:
            self.read_config_file(force=True, strict=strict)
        config_every = self.config_poll_seconds if self.models_config and self.config_poll_seconds > 0 else None
        versions_every = self.version_poll_seconds if self.version_poll_seconds > 0 else None
        if config_every or versions_every:
            self._thread = threading.Thread(target=self._poll, args=(config_every, versions_every),
                                            name="version-poller", daemon=True)
            self._thread.start()

    def _poll(self, config_every: float | None, versions_every: float | None) -> None:
        next_config = time.monotonic() + (config_every or 0)
        next_versions = time.monotonic() + (versions_every or 0)
        while True:
            due = min(t for t, every in ((next_config, config_every), (next_versions, versions_every)) if every)
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            now = time.monotonic()
            try:
                if config_every and now >= next_config:
                    next_config = now + config_every
                    before = self._config_stamp
                    self.read_config_file()
                    if self._config_stamp != before:
                        continue  # on_config has just looked for versions
                if versions_every and now >= next_versions:
                    next_versions = now + versions_every
                    self.on_poll()
            except Exception:  # noqa: BLE001 - the poller must survive anything
                log.exception("version poll failed")

    def stop(self) -> None:
        self._stop.set()

