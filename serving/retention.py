"""Retention: after a push, the serving folder keeps the newest `keep` versions of a model, plus
every version models.config names (labels, a `specific` policy) or a registry alias points to.

The protected set is read under the models.config lock, and folders are removed under it, so a
`loopline promote` (which labels a version under the same lock) either sees the version removed or
keeps it. When the registry cannot be asked, nothing is removed.
"""
from __future__ import annotations

import logging
from typing import Callable

import tensorflow as tf

from serving import create_only
from serving.config_writer import models_config_lock
from serving.model_config import (ModelConfigError, available_versions, find_model, model_config_path,
                                  read_model_server_config, safe_base_path)
from serving.push import claim_path, version_path

log = logging.getLogger("loopline.retention")


def removable(versions: list[int], keep: int, protected: set[int]) -> list[int]:
    """The versions beyond the newest `keep` that nothing protects, oldest first."""
    ordered = sorted(versions)
    newest = set(ordered[-keep:]) if keep > 0 else set()
    return [v for v in ordered if v not in newest and v not in protected]


def named_in_models_config(serving_root: str, name: str) -> set[int]:
    """Versions models.config names for `name`: its labels and a `specific` policy's versions."""
    path = model_config_path(serving_root)
    if not tf.io.gfile.exists(path):
        return set()
    try:
        entry = find_model(read_model_server_config(path), name)
    except ModelConfigError:
        return set()
    return set(entry.version_labels.values()) | set(entry.model_version_policy.specific.versions)


def apply_retention(serving_root: str, name: str, keep: int,
                    registry_versions: Callable[[], set[int]] | None) -> list[int]:
    """Removes `name`'s versions beyond the newest `keep` that models.config and the registry
    (`registry_versions()`: the serving versions its aliases point to; None without a registry)
    do not protect. Returns the removed versions; removes nothing when the registry fails."""
    base = safe_base_path(serving_root, name)
    with models_config_lock(serving_root):
        versions = available_versions(base)
        if len(versions) <= keep:
            return []
        protected = named_in_models_config(serving_root, name)
        if registry_versions is not None:
            try:
                protected |= registry_versions()
            except Exception as exc:  # noqa: BLE001 - any failure: the champion may be among them
                log.warning("retention: no version removed from %s: the registry could not be asked which versions "
                            "its aliases point to (%s)", base, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                return []
        doomed = removable(versions, keep, protected)
        for version in doomed:
            tf.io.gfile.rmtree(version_path(base, version))
            create_only.delete(claim_path(base, version))
            log.info("retention: removed version %d of %s (keeping the newest %d and versions %s)",
                     version, name, keep, sorted(protected) or "none other")
        return doomed
