"""Create-only small files ("markers") on any filesystem the serving folder may be on: the one
atomic step that object stores offer where a local disk has rename(2).

- gs://: an upload with the generation precondition 0 (`if_generation_match=0`), which Cloud
  Storage accepts only when no object has that name: of two writers exactly one succeeds.
- a local path: O_CREAT | O_EXCL.
- any other tf.io.gfile filesystem (ram:// in tests): check, write, read back. This detects a lost
  race when the other writer wrote first; two writers whose check and write interleave can both
  read back their own marker, so there it is a best effort, not a guarantee.

A marker holds a JSON payload (who wrote it, when); `read` returns it, `delete` removes it.
"""
from __future__ import annotations

import json
import os

import tensorflow as tf

# Built on first use: tests replace it with a stand-in made from the real client's API.
_gcs_client = None


def gcs_client():
    global _gcs_client
    if _gcs_client is None:
        from google.cloud import storage

        _gcs_client = storage.Client()
    return _gcs_client


def set_gcs_client(client) -> None:
    global _gcs_client
    _gcs_client = client


def is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _gcs_blob(path: str):
    bucket, _, name = path[len("gs://"):].partition("/")
    return gcs_client().bucket(bucket).blob(name)


def create(path: str, payload: dict) -> bool:
    """Creates the marker `path` holding `payload` unless it exists; True when this call made it."""
    data = json.dumps(payload, sort_keys=True)
    if path.startswith("gs://"):
        return _create_gcs(path, data, payload)
    tf.io.gfile.makedirs(os.path.dirname(path))
    if is_local(path):
        try:
            fd = os.open(path.removeprefix("file://"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(data)
        return True
    if tf.io.gfile.exists(path):
        return False
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(data)
    return read(path) == payload  # someone else's payload: they wrote after our check


def _create_gcs(path: str, data: str, payload: dict) -> bool:
    from google.api_core.exceptions import PreconditionFailed

    try:
        _gcs_blob(path).upload_from_string(data, content_type="application/json", if_generation_match=0)
        return True
    except PreconditionFailed:
        # The client retries a conditional upload whose answer was lost; the retry then fails the
        # precondition on our own object.
        return read(path) == payload


def read(path: str) -> dict | None:
    """The marker's payload; None when it does not exist or is not a marker."""
    try:
        if path.startswith("gs://"):
            from google.api_core.exceptions import NotFound

            try:
                text = _gcs_blob(path).download_as_bytes().decode()
            except NotFound:
                return None
        else:
            with tf.io.gfile.GFile(path) as f:
                text = f.read()
        payload = json.loads(text)
    except (tf.errors.NotFoundError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def delete(path: str) -> None:
    if path.startswith("gs://"):
        from google.api_core.exceptions import NotFound

        try:
            _gcs_blob(path).delete()
        except NotFound:
            pass
        return
    try:
        tf.io.gfile.remove(path)
    except tf.errors.NotFoundError:
        pass
