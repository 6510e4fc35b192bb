"""MLflow's log_artifact(s) and log_model read files on this machine; artifact folders may be on a
remote filesystem (gs://...). These give a local view of a path through tf.io.gfile."""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Iterator

import tensorflow as tf

from serving.model_config import is_remote


def copy_tree(source: str, destination: str) -> None:
    """Copies a file or a folder tree, through tf.io.gfile on both sides."""
    if not tf.io.gfile.isdir(source):
        tf.io.gfile.makedirs(os.path.dirname(destination) or ".")
        tf.io.gfile.copy(source, destination, overwrite=True)
        return
    for folder, _, files in tf.io.gfile.walk(source):
        rel = folder.rstrip("/")[len(source.rstrip("/")):].lstrip("/")  # walk yields source + "/..."
        target = os.path.join(destination, rel) if rel else destination
        tf.io.gfile.makedirs(target)
        for name in files:
            tf.io.gfile.copy(os.path.join(folder, name), os.path.join(target, name), overwrite=True)


@contextlib.contextmanager
def local_view(path: str) -> Iterator[str]:
    """`path` itself when it is on this machine, else a temporary local copy (removed after)."""
    if not is_remote(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="loopline-artifact-") as tmp:
        local = os.path.join(tmp, os.path.basename(path.rstrip("/")) or "root")
        copy_tree(path, local)
        yield local
