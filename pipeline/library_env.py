"""Environment loopline sets for the native libraries its processes load, before they load them:
every `loopline` command sets it for itself (pipeline/cli.py), and the Kubeflow spec sets it on
every component's container, where the entry point is TFX's, not ours."""
from __future__ import annotations

import os

# OpenBLAS (NumPy's and SciPy's copies, both loaded by TFX's and Keras' imports) starts a worker
# thread per extra core; each spins for 2**28 cycles (about 0.1 s) before it sleeps, after it
# starts and after every threaded call: on work that never comes, and per core, so a 16-core pod
# spends seconds at every process start. At 2**4 (OpenBLAS's least) they sleep at once and still
# take their share of a large product.
LIBRARY_ENV = {"OPENBLAS_THREAD_TIMEOUT": "4"}


def set_library_env() -> None:
    """LIBRARY_ENV where the user has set nothing. A library reads it when it loads, so this runs
    before NumPy is imported."""
    for name, value in LIBRARY_ENV.items():
        os.environ.setdefault(name, value)
