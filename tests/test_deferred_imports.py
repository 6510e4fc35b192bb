"""Modules Keras imports with TensorFlow, deferred to their first use (pipeline/deferred_imports.py):
not run by the import, run once on first use, and the real module from then on."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path

import pytest

from pipeline.deferred_imports import DEFERRED, defer_unused_imports
from tests.conftest import REPO, subprocess_env
from tests.serving_helpers import ServerProcess


def write_counting_module(path: Path, body: str = "VALUE = 42") -> Path:
    """A module whose code is `body` and which counts its runs in the file returned."""
    runs = path.with_suffix(".runs")
    path.write_text(f"with open({str(runs)!r}, 'a') as f:\n    f.write('ran\\n')\n{textwrap.dedent(body)}\n")
    return runs


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """make(name, body): a package `name` with a counting module `heavy`; returns (module name,
    its runs file). Removed from sys.modules after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    made = []

    def make(name: str, body: str = "VALUE = 42") -> tuple[str, Path]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
        made.append(name)
        return f"{name}.heavy", write_counting_module(tmp_path / name / "heavy.py", body)

    yield make
    for name in made:
        for key in (name, f"{name}.heavy"):
            sys.modules.pop(key, None)


def run_count(runs) -> int:
    return len(runs.read_text().splitlines()) if runs.exists() else 0


def test_a_deferred_module_runs_on_its_first_attribute_read_and_once(fake_package):
    name, runs = fake_package("ll_deferred_once")
    assert defer_unused_imports((name,)) == [name]
    import ll_deferred_once.heavy as heavy  # the statement alone does not run it

    assert run_count(runs) == 0
    assert heavy.VALUE == 42
    assert heavy.VALUE == 42 and run_count(runs) == 1
    assert type(heavy) is types.ModuleType  # a plain module from then on
    import ll_deferred_once

    assert ll_deferred_once.heavy is heavy and sys.modules[name] is heavy
    with pytest.raises(AttributeError):
        heavy.missing


def test_a_top_level_module_is_deferred_too(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    runs = write_counting_module(tmp_path / "ll_deferred_top.py", "VALUE = 3")
    try:
        assert defer_unused_imports(("ll_deferred_top", "ll_no_such_top")) == ["ll_deferred_top"]
        import ll_deferred_top

        assert run_count(runs) == 0
        assert ll_deferred_top.VALUE == 3 and run_count(runs) == 1
    finally:
        sys.modules.pop("ll_deferred_top", None)


def test_a_deferred_package_gives_a_submodule_asked_for_by_name_without_running(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "ll_deferred_pkg").mkdir()
    package_runs = write_counting_module(tmp_path / "ll_deferred_pkg" / "__init__.py", "VALUE = 1")
    module_runs = write_counting_module(tmp_path / "ll_deferred_pkg" / "sub.py", "X = 2")
    try:
        defer_unused_imports(("ll_deferred_pkg",))
        from ll_deferred_pkg import sub

        assert sub.X == 2 and run_count(module_runs) == 1 and run_count(package_runs) == 0
        import ll_deferred_pkg

        assert ll_deferred_pkg.VALUE == 1 and run_count(package_runs) == 1  # anything else runs the package
        assert ll_deferred_pkg.sub is sub and run_count(module_runs) == 1
    finally:
        for name in ("ll_deferred_pkg", "ll_deferred_pkg.sub"):
            sys.modules.pop(name, None)


def test_threads_reading_at_once_run_it_once(fake_package):
    name, runs = fake_package("ll_deferred_threads", "import time\ntime.sleep(0.3)\nVALUE = 7")
    defer_unused_imports((name,))
    import ll_deferred_threads.heavy as heavy

    seen = []
    threads = [threading.Thread(target=lambda: seen.append(heavy.VALUE)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == [7] * 4 and run_count(runs) == 1


def test_a_module_that_fails_fails_as_an_import_and_is_tried_again(fake_package):
    name, runs = fake_package("ll_deferred_broken", "raise RuntimeError('broken on purpose')")
    defer_unused_imports((name,))
    import ll_deferred_broken.heavy as heavy

    with pytest.raises(RuntimeError, match="broken on purpose"):
        heavy.VALUE
    assert name not in sys.modules
    with pytest.raises(RuntimeError, match="broken on purpose"):
        import ll_deferred_broken.heavy  # noqa: F401  run again, as any failed import
    assert run_count(runs) == 2


def test_only_what_is_installed_and_not_imported_is_deferred(fake_package):
    name, runs = fake_package("ll_deferred_imported")
    import ll_deferred_imported  # noqa: F401  its package is already there: left alone

    assert defer_unused_imports((name, "ll_no_such_package.heavy")) == []
    assert name not in sys.modules and run_count(runs) == 0


def test_a_child_of_an_imported_namespace_package_is_deferred(tmp_path, monkeypatch):
    """A namespace package (`google.cloud`) runs no code when imported, so its children can still
    be deferred; the attribute the import system would set on it points at the deferred child."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "ll_namespace").mkdir()  # no __init__.py: a namespace package
    runs = write_counting_module(tmp_path / "ll_namespace" / "client.py", "VALUE = 5")
    try:
        import ll_namespace

        assert defer_unused_imports(("ll_namespace.client",)) == ["ll_namespace.client"]
        from ll_namespace import client

        assert ll_namespace.client is client and run_count(runs) == 0
        assert client.VALUE == 5 and run_count(runs) == 1
    finally:
        for name in ("ll_namespace", "ll_namespace.client"):
            sys.modules.pop(name, None)


def run_python(script: str) -> dict:
    """Runs `script` in a fresh Python process of this checkout; its last stdout line, as JSON."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, env=subprocess_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_tensorflow_loads_without_sklearn_pyplot_and_ipython_which_still_work(tmp_path):
    """In a fresh process: TensorFlow's import runs neither scikit-learn, pyplot nor IPython, and
    Keras' sklearn wrapper, a pyplot chart and IPython work when used."""
    script = f"""
        import json, sys
        from pipeline.deferred_imports import DEFERRED, defer_unused_imports
        deferred = defer_unused_imports()
        import tensorflow as tf
        after_import = {{"sklearn": "sklearn" in sys.modules,
                         "pyplot_ran": "figure" in vars(sys.modules["matplotlib.pyplot"]),
                         "ipython_ran": "get_ipython" in vars(sys.modules["IPython"])}}
        from keras.wrappers import SKLearnClassifier
        import sklearn.base
        wrapper_ok = issubclass(SKLearnClassifier, sklearn.base.BaseEstimator)
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3])
        fig.savefig({str(tmp_path / "chart.png")!r})
        import setuptools  # what a user's module may still use
        setuptools_ok = callable(setuptools.setup) and type(setuptools) is type(sys)
        from IPython import InteractiveShell  # runs IPython
        ipython_ok = "get_ipython" in vars(sys.modules["IPython"]) and InteractiveShell.initialized() is False
        print(json.dumps({{"deferred": deferred, "tensorflow": tf.__version__, "after_import": after_import,
                          "wrapper_ok": wrapper_ok, "pyplot_is_module": matplotlib.pyplot is plt,
                          "ipython_ok": ipython_ok, "setuptools_ok": setuptools_ok}}))
    """
    result = run_python(script)
    assert result["deferred"] == list(DEFERRED)  # each installed, none imported before
    assert result["after_import"] == {"sklearn": False, "pyplot_ran": False, "ipython_ran": False}
    assert result["ipython_ok"] and result["setuptools_ok"]
    assert result["wrapper_ok"] and result["pyplot_is_module"]
    assert (tmp_path / "chart.png").stat().st_size > 1000


def test_ipython_answers_get_ipython_without_running_and_mlflow_runs_its_gateway_when_used():
    """In a fresh process: IPython's `get_ipython()` answers as IPython would (None, then the shell
    once one is made) without IPython's package running; MLflow imports without running its
    gateway (nor FastAPI), which runs on first use."""
    result = run_python("""
        import json, sys
        from pipeline.deferred_imports import defer_unused_imports
        defer_unused_imports(("IPython", "mlflow.gateway"))
        from IPython import get_ipython
        no_shell = get_ipython()
        from IPython.core.interactiveshell import InteractiveShell  # makes a shell, IPython's package not run
        shell = InteractiveShell.instance()
        from IPython import get_ipython
        answers = [no_shell is None, get_ipython() is shell, "embed" in vars(sys.modules["IPython"])]
        import IPython
        answers += [IPython.embed is not None, IPython.get_ipython() is shell]  # runs IPython's package
        import mlflow
        gateway = ["get_gateway_uri" in vars(mlflow.gateway), "fastapi" in sys.modules]
        from mlflow.gateway import get_gateway_uri
        gateway += [callable(get_gateway_uri), "fastapi" in sys.modules]
        print(json.dumps({"answers": answers, "gateway": gateway}))
    """)
    assert result["answers"] == [True, True, False, True, True]
    assert result["gateway"] == [False, False, True, True]


def run_command(*args: str, checks: dict[str, str] | None = None) -> dict:
    """`loopline <args>` as its process's own command, in a fresh process: its exit code, what it
    printed, whether TensorFlow's own code ran and, per `checks`, the value of each expression
    after the command (`ran(module, attribute)`: whether the module's code ran far enough to set
    the attribute; None when the module was never imported)."""
    checks = {"tensorflow_ran": 'ran("tensorflow", "__version__")', **(checks or {})}
    values = ", ".join(f"{key!r}: {expression}" for key, expression in checks.items())
    return run_python(f"""
        import contextlib, io, json, sys
        sys.argv = ["loopline", *{list(args)!r}]
        from pipeline import cli
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            code = cli.main()
        ran = lambda name, attribute: attribute in vars(sys.modules[name]) if name in sys.modules else None
        print(json.dumps({{"code": code, "lines": printed.getvalue().splitlines(), {values}}}))
    """)


def test_the_loopline_command_defers_them_and_its_charts_still_draw(pipeline_run, tmp_path):
    """`loopline data report` as its own process (TensorFlow imported, pyplot used for the
    charts): the report is written with its PNGs, and Keras' sklearn wrappers were never run
    (scikit-learn itself comes in here through TFX's TensorFlow Model Analysis and NLTK, IPython
    through Beam's BigQuery client)."""
    config, _ = pipeline_run
    result = run_command("data", "report", "--config", str(REPO / "loopline.yaml"),
                         "--set", f"pipeline.root={config.pipeline.root}", "--out", str(tmp_path / "report"),
                         checks={"keras_wrappers_ran": 'ran("keras.wrappers", "SKLearnClassifier")',
                                 "pyplot_ran": 'ran("matplotlib.pyplot", "figure")'})
    assert result["code"] == 0, result["lines"]
    assert (result["tensorflow_ran"], result["keras_wrappers_ran"], result["pyplot_ran"]) == (True, False, True)
    charts = list((tmp_path / "report").glob("*.png"))
    assert charts and all(chart.stat().st_size > 1000 for chart in charts)


def test_client_commands_answer_without_running_tensorflow(pipeline_run):
    """`loopline predict` (gRPC and REST) and `loopline models` use TensorFlow Serving's protos and
    MLflow, not TensorFlow: its import is deferred there, and the answers are the usual ones."""
    config, _ = pipeline_run
    root = config.pipeline.root
    server = ServerProcess(Path(root))
    try:
        common = ["--config", str(REPO / "loopline.yaml"), "--set", f"pipeline.root={root}"]
        rows = str(REPO / "data" / "penguins.csv")
        over_grpc = run_command("predict", rows, *common, "--port", str(server.grpc_port))
        over_rest = run_command("predict", rows, "--rest", *common, "--port", str(server.rest_port))
    finally:
        server.stop()
    models = run_command("models", *common, checks={"fastapi": '"fastapi" in sys.modules'})
    for result in (over_grpc, over_rest, models):
        assert result["code"] == 0 and not result["tensorflow_ran"], result
    assert not models["fastapi"]  # MLflow's gateway is never run
    assert over_grpc["lines"] == over_rest["lines"] and len(over_grpc["lines"]) == 344
    assert over_grpc["lines"][0].startswith("row 0: body_mass_g=") and "class=" in over_grpc["lines"][0]
    assert re.fullmatch(rf"{config.serving.model_name} \((\d+) versions\)", models["lines"][0])
    assert models["lines"][1].split()[:2] == ["version", "aliases"] and models["lines"][2].split()[0].isdigit()


def test_a_whole_run_never_runs_tfx_components_nor_model_analysis(tmp_path):
    """`loopline run` as its own process: TFX's runner gets TensorFlow Model Analysis' config
    messages (its `sdk` module) without the package, `tfx.components` is never run, nor tqdm's
    notebook bar (Beam's BigQuery client), IPython (Beam asks for its shell at every transform),
    MLflow's gateway or setuptools (TFX's artifact classes); the run trains, pushes and registers
    as usual."""
    result = run_command("run", "--config", str(REPO / "loopline.yaml"), "--set", f"pipeline.root={tmp_path / 'root'}",
                         "--set", "trainer.epochs=1", checks={
                             "model_analysis_ran": 'ran("tensorflow_model_analysis", "evaluators")',
                             "sdk_loaded": 'ran("tensorflow_model_analysis.sdk", "EvalConfig")',
                             "tfx_components_ran": 'ran("tfx.components", "Evaluator")',
                             "ipython_ran": 'ran("IPython", "embed")', "gateway_ran": 'ran("mlflow.gateway", "get_gateway_uri")',
                             "sklearn": '"sklearn" in sys.modules', "ipywidgets": '"ipywidgets" in sys.modules',
                             "fastapi": '"fastapi" in sys.modules', "setuptools_ran": 'ran("setuptools", "setup")',
                             "google_cloud_ran": '[ran(f"google.cloud.{n}", a) for n, a in (("bigquery", "Client"), '
                                                 '("bigquery_storage_v1", "BigQueryReadClient"), '
                                                 '("pubsub", "PublisherClient"), ("dataflow", "__version__"))]'})
    assert result["code"] == 0, result["lines"]
    assert result["sdk_loaded"] is True and result["model_analysis_ran"] is False
    assert result["tfx_components_ran"] is False
    assert not result["sklearn"] and not result["ipywidgets"]  # nor Beam's notebook progress bar
    assert (result["ipython_ran"], result["gateway_ran"], result["fastapi"]) == (False, False, False)
    assert result["google_cloud_ran"] == [False] * 4  # Beam's Google Cloud clients
    assert result["setuptools_ran"] is False  # imported by TFX's artifact classes, never used
    assert "loopline run finished" in result["lines"]
    assert any(line.startswith("pushed") for line in result["lines"]), result["lines"]
