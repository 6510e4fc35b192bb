"""The supervised server's load journal: which version is loading right now, so that a server
process killed by that load (or its warmup) is not killed by it again. Before a version loads,
`loading.json` names it (written under a temporary name, then renamed); once the load ends either
way the file is removed. A server that starts and finds the file left behind knows the previous
process died loading that version: it adds it to `crashed.json`, and the manager refuses every
crashed version as it refuses a version that failed to load, until its files change.

Both files live in the supervisor's folder (serving.supervisor): they last as long as the
`loopline serve` that started the servers; a new `loopline serve` tries every version again."""
from __future__ import annotations

import contextlib
import json
import logging
import os

from serving import supervisor

log = logging.getLogger("loopline.serving")

LOADING_FILE = "loading.json"
CRASHED_FILE = "crashed.json"


def crash_message(cause: str) -> str:
    return (f"loading this version crashed the server process ({cause or 'unknown cause'}); not loaded again "
            "until its files change")


def _write_json(path: str, value) -> None:
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as f:
        json.dump(value, f)
    os.replace(temporary, path)


def _read_json(path: str, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


class LoadJournal:
    """`folder` None: no journal (the server is not supervised)."""

    def __init__(self, folder: str | None, last_exit: str = ""):
        self.folder = folder
        self._crashed: list[dict] = []
        if folder is not None:
            self._crashed = _read_json(os.path.join(folder, CRASHED_FILE), [])
            self._take_left_over_load(last_exit)

    @classmethod
    def from_environment(cls) -> "LoadJournal":
        """The journal of a server started by serving.supervisor; none otherwise."""
        return cls(supervisor.state_folder(), supervisor.last_exit())

    def _take_left_over_load(self, cause: str) -> None:
        path = os.path.join(self.folder, LOADING_FILE)
        entry = _read_json(path, None)
        if entry is None:
            return
        entry["message"] = crash_message(cause)
        self._crashed.append(entry)
        _write_json(os.path.join(self.folder, CRASHED_FILE), self._crashed)
        os.remove(path)
        log.error("model %s version %d refused: %s (folder %s)", entry["model"], entry["version"], entry["message"],
                  entry["path"])

    def crashed_versions(self, model: str) -> dict[int, tuple[tuple, str]]:
        """{version: (its folder's fingerprint when it crashed, the message)} for `model`; the
        latest crash of a version counts."""
        return {e["version"]: (tuple(e["fingerprint"]), e["message"]) for e in self._crashed if e["model"] == model}

    @contextlib.contextmanager
    def loading(self, model: str, version: int, path: str, fingerprint: tuple):
        """Around a version's load and warmup."""
        if self.folder is None:
            yield
            return
        journal = os.path.join(self.folder, LOADING_FILE)
        _write_json(journal, {"model": model, "version": version, "path": path, "fingerprint": list(fingerprint)})
        try:
            yield
        finally:
            os.remove(journal)
