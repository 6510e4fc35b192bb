"""TF Serving's `models.config` (a ModelServerConfig textproto): build, read, write atomically,
and move version labels. Used by the pipeline (after a push), `loopline promote` and the server.

Model names must be plain names and base paths must stay inside the serving root, so a config
cannot point the server at files outside it. Roots may be local folders or URIs that
tf.io.gfile reads (gs://, s3://...), as a pipeline run on a cluster pushes there.
"""
from __future__ import annotations

import os
import re
import uuid

import tensorflow as tf
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

MODEL_CONFIG_FILE = "models.config"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ModelConfigError(ValueError):
    """A models.config problem, naming the model and what is wrong."""


def is_remote(path: str) -> bool:
    return "://" in path


def model_config_path(serving_root: str) -> str:
    return os.path.join(serving_root, MODEL_CONFIG_FILE)


def check_model_name(name: str) -> str:
    if not _NAME.match(name) or name in (".", ".."):
        raise ModelConfigError(f"model name {name!r} is not a plain name (letters, digits, '_', '.', '-')")
    return name


def safe_base_path(serving_root: str, name: str) -> str:
    """`<serving_root>/<name>`, refusing anything that resolves outside the serving root."""
    check_model_name(name)
    if is_remote(serving_root):  # no links in object stores; a plain name cannot climb out
        return f"{serving_root.rstrip('/')}/{name}"
    root = resolved_path(serving_root)
    base = resolved_path(os.path.join(root, name))
    if os.path.dirname(base) != root:
        raise ModelConfigError(f"model {name!r}: base path {base} escapes the serving root {root}")
    return base


def available_versions(base_path: str) -> list[int]:
    """Numeric version folders holding a saved_model.pb, ascending."""
    if not tf.io.gfile.isdir(base_path):
        return []
    versions = []
    for entry in tf.io.gfile.listdir(base_path):
        entry = entry.rstrip("/")  # object stores list folders with a trailing slash
        if entry.isdigit() and tf.io.gfile.exists(os.path.join(base_path, entry, "saved_model.pb")):
            versions.append(int(entry))
    return sorted(versions)


def read_model_server_config(path: str) -> model_server_config_pb2.ModelServerConfig:
    config = model_server_config_pb2.ModelServerConfig()
    try:
        with tf.io.gfile.GFile(path) as f:
            text_format.Parse(f.read(), config)
    except text_format.ParseError as exc:
        raise ModelConfigError(f"{path}: not a valid ModelServerConfig textproto: {exc}") from None
    return config


def write_textproto(path: str, message) -> None:
    """Writes a temporary file and renames it over `path`, so a polling server never reads half
    a file (also on object stores, where the rename replaces the object whole)."""
    folder = os.path.dirname(path)
    tf.io.gfile.makedirs(folder)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    with tf.io.gfile.GFile(tmp, "w") as f:
        f.write(text_format.MessageToString(message))
    tf.io.gfile.rename(tmp, path, overwrite=True)


def write_model_server_config(path: str, config: model_server_config_pb2.ModelServerConfig) -> None:
    write_textproto(path, config)


def resolved_path(path: str) -> str:
    """A local path with links resolved; a remote URI as it is (object stores have no links)."""
    return path if is_remote(path) else os.path.realpath(path)


def find_model(config: model_server_config_pb2.ModelServerConfig, name: str):
    for model in config.model_config_list.config:
        if model.name == name:
            return model
    raise ModelConfigError(f"model {name!r} is not in models.config")


def set_version_labels(path: str, name: str, labels: dict[str, int]) -> model_server_config_pb2.ModelServerConfig:
    """Points each label at a version (others keep theirs) and makes sure labelled versions are
    served: TF Serving only resolves labels to loaded versions."""
    config = read_model_server_config(path)
    model = find_model(config, name)
    available = available_versions(model.base_path)
    for label, version in labels.items():
        if version not in available:
            raise ModelConfigError(f"model {name!r}: label {label!r} -> version {version}, but versions on disk are {available}")
        model.version_labels[label] = version
    wanted = sorted(set(model.version_labels.values()) | ({available[-1]} if available else set()))
    model.model_version_policy.Clear()
    model.model_version_policy.specific.versions.extend(wanted)
    write_model_server_config(path, config)
    return config


def labelled_or_latest_version(serving_root: str, name: str, label: str) -> str | None:
    """The version folder `label` points at in models.config, else the highest one on disk
    (None when nothing is pushed): the champion a new candidate is compared with."""
    base = safe_base_path(serving_root, name)
    versions = available_versions(base)
    config_path = model_config_path(serving_root)
    if label and tf.io.gfile.exists(config_path):
        try:
            labelled = find_model(read_model_server_config(config_path), name).version_labels.get(label)
        except ModelConfigError:
            labelled = None
        if labelled in versions:
            return os.path.join(base, str(labelled))
    return os.path.join(base, str(versions[-1])) if versions else None
