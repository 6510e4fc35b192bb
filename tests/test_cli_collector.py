"""`loopline run` as the process's command makes its imports with the cyclic collector off and
sets them aside from it after; called from Python it leaves the caller's collector alone. Every
command sets the native libraries' environment (pipeline/library_env.py) before NumPy loads."""
import gc
import subprocess
import sys

import pytest

from conftest import REPO, subprocess_env
from pipeline.cli import _kept_to_the_end


def test_imports_are_made_without_the_collector_and_set_aside_after():
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        with _kept_to_the_end(True):
            assert not gc.isenabled()
            made = [[] for _ in range(1000)]  # 1000 objects the collector tracks
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen + len(made)
    finally:
        gc.unfreeze()


def test_a_caller_s_collector_is_left_as_it_is():
    frozen = gc.get_freeze_count()
    with _kept_to_the_end(False):
        assert gc.isenabled()
        made = [[] for _ in range(1000)]
    assert gc.isenabled() and gc.get_freeze_count() == frozen and len(made) == 1000


def _modules_after_import_tracking(*overrides: str) -> set[str]:
    """The MLflow modules a fresh process holds after import_tracking on the bundled config."""
    code = ("import sys\nfrom pipeline.config import load_config\nfrom pipeline.tracking_setup import import_tracking\n"
            f"import_tracking(load_config({str(REPO / 'loopline.yaml')!r}, {list(overrides)!r}))\n"
            "print(' '.join(m for m in sys.modules if m.startswith('mlflow')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=subprocess_env(),
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(done.stdout.split())


def test_a_run_s_mlflow_modules_are_imported_up_front_only_when_it_tracks():
    embedded = _modules_after_import_tracking()
    assert {"mlflow.pyfunc", "mlflow.store.tracking.sqlalchemy_store",
            "mlflow.store.model_registry.sqlalchemy_store"} <= embedded
    server = _modules_after_import_tracking("mlflow.tracking_uri=http://127.0.0.1:5000")
    assert "mlflow.pyfunc" in server and "mlflow.store.tracking.sqlalchemy_store" not in server
    assert not _modules_after_import_tracking("mlflow.enabled=false")


@pytest.mark.parametrize("command", ["main(['run', '--config', 'no-such-config.yaml'])",  # loopline
                                     "tf_serving_main(['--version'])"])  # tensorflow_model_server
def test_every_command_has_openblas_idle_workers_sleep_before_numpy_loads(command):
    """The setting is read when OpenBLAS loads: the command must make it before anything imports
    NumPy, and leave a value the user set."""
    code = ("import os, sys\nimport pipeline.cli as cli\nset_it = cli.set_library_env\n"
            "def watched():\n    print('numpy loaded' if 'numpy' in sys.modules else 'numpy not loaded')\n    set_it()\n"
            "    print('timeout', os.environ['OPENBLAS_THREAD_TIMEOUT'], flush=True)\n"
            f"cli.set_library_env = watched\ncli.{command}\n")
    env = subprocess_env()
    env.pop("OPENBLAS_THREAD_TIMEOUT", None)
    for given, expected in ((None, "4"), ("12", "12")):
        if given:
            env["OPENBLAS_THREAD_TIMEOUT"] = given
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
        assert "numpy not loaded" in done.stdout, done.stdout + done.stderr[-2000:]
        assert f"timeout {expected}" in done.stdout, done.stdout + done.stderr[-2000:]
