"""A real `mlflow server` on 127.0.0.1 for tests: SQLite backend and served artifacts in a folder,
a bounded start wait, and a stop that always ends the process group."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import portpicker

from tests.conftest import subprocess_env

START_TIMEOUT_S = 90


def free_port() -> int:
    return portpicker.pick_unused_port()


class MlflowServer:
    def __init__(self, folder: Path, port: int | None = None):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "MlflowServer":
        log = open(self.folder / "server.log", "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
             "--backend-store-uri", f"sqlite:///{self.folder / 'mlflow.db'}",
             "--artifacts-destination", str(self.folder / "artifacts"), "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, env=subprocess_env(), start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.process.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer within {START_TIMEOUT_S}s: {self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL, as an outage would: no graceful shutdown."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, sig) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=20)

    def log_tail(self) -> str:
        path = self.folder / "server.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""
