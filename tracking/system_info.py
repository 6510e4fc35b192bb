"""What a run ran on: package versions, devices, the host and the git commit."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata

PACKAGES = ("tensorflow", "keras", "tfx", "ml-metadata", "mlflow", "numpy", "tensorflow-serving-api", "ai-edge-litert")


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def devices() -> list[str]:
    """TensorFlow's physical devices, e.g. ['CPU:0', 'GPU:0'] (only when TF is already imported,
    so a tracking call never pays for importing it)."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return []
    return [f"{d.device_type}:{d.name.rsplit(':', 1)[-1]}" for d in tf.config.list_physical_devices()]


def git_commit(folder: str | None = None, ignore: tuple[str, ...] = ()) -> str | None:
    """HEAD of the repository holding `folder` (the working directory by default), with '-dirty'
    appended when tracked files are modified; None outside a repository or without git.
    `ignore`: paths (from the repository's top) whose changes do not count, such as the files a
    benchmark itself rewrites on every run."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        excluded = [f":(top,exclude){path}" for path in ignore]
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ":(top)", *excluded],
                               cwd=folder, capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


COMMIT_ENV = "LOOPLINE_GIT_COMMIT"


def current_commit() -> str | None:
    """The commit the running code came from: $LOOPLINE_GIT_COMMIT (set it in container images,
    which carry no .git) or the working directory's repository."""
    return os.environ.get(COMMIT_ENV) or git_commit()


def system_tags(commit: str | None = None) -> dict[str, str]:
    """Package versions, platform, host, devices and the git commit (`commit`, else looked up)."""
    tags = {f"system.version.{name}": version for name, version in package_versions().items()}
    tags["system.python"] = platform.python_version()
    tags["system.platform"] = platform.platform()
    tags["system.host"] = platform.node()
    found = devices()
    if found:
        tags["system.devices"] = ",".join(found)
    commit = commit or current_commit()
    if commit:
        tags["loopline.git_commit"] = commit
        tags["mlflow.source.git.commit"] = commit
    return tags
