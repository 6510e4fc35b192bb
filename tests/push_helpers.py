"""A small SavedModel to push, file hashes through tf.io.gfile (local and ram:// alike), and a
child process that pushes once, stopping at a pause point of serving.push until told to go (or
until it is killed)."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import tensorflow as tf

from tests.conftest import subprocess_env


def small_saved_model(path: str, seed: int = 0) -> str:
    """A SavedModel with a variables file of ~64 KB (big enough to stop half way through)."""

    class Scale(tf.Module):
        def __init__(self):
            self.w = tf.Variable(tf.random.stateless_normal([256, 64], seed=[seed, 1]))

        @tf.function(input_signature=[tf.TensorSpec([None, 256], tf.float32)])
        def __call__(self, x):
            return {"y": tf.matmul(x, self.w)}

    module = Scale()
    tf.saved_model.save(module, path, signatures=module.__call__)
    return path


def tree_hashes(path: str) -> dict[str, str]:
    """{relative file path: sha256} of a folder, through tf.io.gfile."""
    out = {}
    root = path.rstrip("/")
    for folder, _, names in tf.io.gfile.walk(root):
        for name in names:
            full = f"{folder.rstrip('/')}/{name}"
            with tf.io.gfile.GFile(full, "rb") as f:
                out[full[len(root) + 1:]] = hashlib.sha256(f.read()).hexdigest()
    return out


CHILD = """
import json, logging, os, sys, time
from serving import push
model, base, pinned, stop_at, signals = sys.argv[1:6]
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
if pinned:
    push.clock = lambda: float(pinned)
def hook(point):
    if point == stop_at:
        open(os.path.join(signals, f"{os.getpid()}.paused"), "w").close()
        while not os.path.exists(os.path.join(signals, "go")):
            time.sleep(0.05)
push.pause_hook = hook
pushed = push.push_model(model, base)
print(json.dumps({"version": pushed.version, "path": pushed.path}))
"""


def start_push(model: str, base: str, signals: Path, stop_at: str = "", pinned: float | None = None):
    """A child process pushing `model` to `base`; it waits at `stop_at` until `signals/go` exists."""
    return subprocess.Popen([sys.executable, "-c", CHILD, model, base, "" if pinned is None else str(pinned),
                             stop_at, str(signals)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=subprocess_env(TF_CPP_MIN_LOG_LEVEL="3"))


def wait_paused(signals: Path, count: int, processes, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while len(list(signals.glob("*.paused"))) < count:
        for p in processes:
            if p.poll() is not None:
                raise AssertionError(f"push ended before its pause point: {p.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError("pushes did not reach their pause point")
        time.sleep(0.05)


def finished(process, timeout_s: float = 120) -> tuple[dict, str]:
    out, err = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1]), err
