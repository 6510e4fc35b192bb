"""TF Serving's `models.config` (a ModelServerConfig textproto): build, read, write atomically,
and move version labels. Used by the pipeline (after a push), `loopline promote` and the server.

The configs loopline writes name plain model names with base paths `<serving root>/<name>`
(safe_base_path); the server itself takes any absolute base path from a config file its operator
gives it, as TF Serving does (serving.allowed_base_paths limits the ones a network reload may name).
Roots may be local folders or URIs that tf.io.gfile reads (gs://, s3://...), as a pipeline run on
a cluster pushes there.

Version folders are read as TF Serving reads them (file_system_storage_path_source.cc): a child of
the base path whose name parses as a base-10 integer is that version, leading zeros and all
(`00000123` is version 123), and the model is loaded from the folder as it is named.
"""
from __future__ import annotations

import logging
import os
import re
import uuid

import tensorflow as tf
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

MODEL_CONFIG_FILE = "models.config"
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")  # TensorFlow's kSavedModelFilenamePb, ...Pbtxt
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_VERSION = re.compile(r"[0-9]+")  # ASCII digits only: str.isdigit() also takes other scripts' digits

log = logging.getLogger("loopline.serving")


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


def parse_version(name: str) -> int | None:
    """The version a folder name stands for (ParseVersionNumber): ASCII digits, base 10, leading
    zeros allowed, within int64; None for anything else. (absl::SimpleAtoi would also take a sign
    or surrounding spaces; such folders are not versions here.)"""
    if not _VERSION.fullmatch(name):
        return None
    version = int(name)
    return version if version < 2**63 else None


def version_folders(base_path: str) -> dict[int, str]:
    """{version: folder name} of the base path's children, as IndexChildrenByVersion builds it:
    when two names parse to one version (`7` and `007`), the one sorting last is used."""
    if not tf.io.gfile.isdir(base_path):
        return {}
    folders: dict[int, str] = {}
    for entry in sorted(e.rstrip("/") for e in tf.io.gfile.listdir(base_path)):  # object stores add a "/"
        version = parse_version(entry)
        if version is None:
            continue
        if version in folders:
            log.warning("duplicate version folders under %s: version %d will be loaded from %s, %s is ignored",
                        base_path, version, entry, folders[version])
        folders[version] = entry
    return folders


def saved_model_file(version_dir: str) -> str | None:
    """The SavedModel's graph file in a version folder (saved_model.pb, else saved_model.pbtxt,
    as TensorFlow's loader looks for them); None when there is neither."""
    for name in SAVED_MODEL_FILES:
        path = os.path.join(version_dir, name)
        if tf.io.gfile.exists(path):
            return path
    return None


def available_versions(base_path: str) -> list[int]:
    """Versions whose folder holds a SavedModel, ascending (what a pusher has finished writing)."""
    folders = version_folders(base_path)
    return sorted(v for v, folder in folders.items() if saved_model_file(os.path.join(base_path, folder)))


def version_path(base_path: str, version: int) -> str:
    """The folder of `version` as found on disk (`<base>/00000123` for 123), else `<base>/<version>`."""
    return os.path.join(base_path, version_folders(base_path).get(version, str(version)))


def read_model_server_config(path: str) -> model_server_config_pb2.ModelServerConfig:
    config = model_server_config_pb2.ModelServerConfig()
    try:
        with tf.io.gfile.GFile(path) as f:
            text_format.Parse(f.read(), config)
    except text_format.ParseError as exc:
        # TF Serving's (protobuf's) wording first, so logs and scripts that look for it find it.
        raise ModelConfigError(f"Error parsing text-format tensorflow.serving.ModelServerConfig: {path}: {exc}") from None
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


def path_is_under(path: str, roots: list[str]) -> bool:
    """Whether `path` is one of `roots` or inside one, compared component by component: local paths
    with links resolved, URIs as written (and never with a `..` part, which some stores do not
    resolve)."""
    if is_remote(path):
        if ".." in path.split("/"):
            return False
        target = path.rstrip("/")
        return any(is_remote(r) and (target == r.rstrip("/") or target.startswith(r.rstrip("/") + "/")) for r in roots)
    target = resolved_path(path)
    for root in roots:
        if is_remote(root):
            continue
        root = resolved_path(root)
        if target == root or target.startswith(root.rstrip(os.sep) + os.sep):
            return True
    return False


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
            return version_path(base, labelled)
    return version_path(base, versions[-1]) if versions else None
