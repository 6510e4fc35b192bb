"""Modules a `loopline` command does not use, loaded when first used instead: those TensorFlow's
import of Keras and TFX's runner bring in (DEFERRED), and TensorFlow itself for the commands that
only talk to a server or to the registry (pipeline/cli.py).

Keras 3, loaded as TensorFlow's `tf.keras`, imports scikit-learn (for the estimators of
`keras.wrappers`), matplotlib's pyplot (for the image galleries of `keras.visualization`) and
IPython (for the notebook view of `keras.saving`'s file editor) wherever they are installed: about
1.3 CPU seconds of every `loopline` process's start, more than a quarter of TensorFlow's import.
TFX's runner imports `tfx.components` (every TFX component, for one constant of its Evaluator)
and TensorFlow Model Analysis (its evaluators and metrics, NLTK and scikit-learn, for the config
messages of `tensorflow_model_analysis.sdk`), and Beam's BigQuery client imports tqdm's notebook
progress bar (ipywidgets and IPython): about 1.8 CPU seconds of `loopline run`, whose components
are loopline's own. MLflow's import runs its AI gateway's package (FastAPI with it) for a module of
constants its GenAI judges read, Beam asks IPython for its shell at every transform it applies,
answered here without running IPython (_get_ipython), and Beam's I/O modules import Google
Cloud's BigQuery, Pub/Sub and Dataflow clients: about 0.7 CPU seconds more. TFX's artifact
classes import setuptools (and with it pkg_resources) when the first one is made, only to learn
whether all of TFX is installed: 0.1 CPU seconds of `loopline run`, which never uses setuptools.

Before TensorFlow loads, each of DEFERRED is put in sys.modules as the module the import system
would make, whose code runs the first time one of its attributes is read; a package's submodule
asked for by name (`from package import module`) is imported without it. The `import` statements
stay as they are, and whoever uses the module (a user's module file, the data report's charts)
gets the real one.

Not importlib.util.LazyLoader: in Python 3.11 any later `import` of the name reads the module's
`__spec__`, and that read runs the module.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import types

DEFERRED = ("IPython", "keras.wrappers", "matplotlib.pyplot", "tfx.components", "tensorflow_model_analysis",
            "tqdm.notebook", "mlflow.gateway",
            # Google Cloud's clients, which Beam imports for its BigQuery, Pub/Sub and Dataflow I/O
            # and uses only when a pipeline reads or writes there
            "google.cloud.bigquery", "google.cloud.bigquery_storage_v1", "google.cloud.pubsub",
            "google.cloud.dataflow",
            # imported, never used, by TFX's artifact classes (tfx.types.standard_artifacts)
            "setuptools")

# One thread runs a module's code, the others wait for it; re-entrant, as that code may read the
# module's own attributes while it runs (those not set yet are missing, as in any import).
_lock = threading.RLock()
# Names whose code has not started: not the module's class, which must stay _Deferred while its
# code runs so that other threads' reads still come to the lock and wait.
_pending: set[str] = set()


def _get_ipython():
    """IPython's `get_ipython()` (its body) without running IPython's package, which Beam asks at
    every transform it applies: the shell, which only IPython.core.interactiveshell makes, or None."""
    shell = sys.modules.get("IPython.core.interactiveshell")
    return shell.InteractiveShell.instance() if shell and shell.InteractiveShell.initialized() else None


def _ipython_version_info() -> tuple:
    """IPython's `version_info` from its installed metadata: matplotlib reads it whenever a figure
    is made (FigureCanvasBase) when IPython is in sys.modules, as a deferred one is."""
    from importlib import metadata

    return tuple(int(part) if part.isdigit() else part for part in metadata.version("ipython").split("."))


# Attributes a deferred module answers without running its code: (module, attribute) -> a
# function making the answer.
_KNOWN_BEFORE_RUNNING = {("IPython", "get_ipython"): lambda: _get_ipython,
                         ("IPython", "version_info"): _ipython_version_info}


class _Deferred(types.ModuleType):
    """A module whose code has not run yet: reading an attribute it lacks runs it first, except
    a package's submodule (`from package import module`), which is imported alone, and those of
    _KNOWN_BEFORE_RUNNING."""

    def __getattr__(self, name: str):
        with _lock:
            if self.__name__ in _pending:
                if (self.__name__, name) in _KNOWN_BEFORE_RUNNING:
                    return _KNOWN_BEFORE_RUNNING[self.__name__, name]()
                if _is_submodule(self, name):
                    return importlib.import_module(f"{self.__name__}.{name}")
                self._run()
        return types.ModuleType.__getattribute__(self, name)

    def _run(self) -> None:
        _pending.discard(self.__name__)
        try:
            self.__spec__.loader.exec_module(self)
        except BaseException:
            sys.modules.pop(self.__name__, None)  # as a failed import: the next import tries again
            raise
        self.__class__ = types.ModuleType
        _set_on_package(self)  # as the import system does once a submodule has loaded


def _is_submodule(package: types.ModuleType, name: str) -> bool:
    path = package.__dict__.get("__path__")
    return path is not None and importlib.machinery.PathFinder.find_spec(f"{package.__name__}.{name}", path) is not None


def defer_unused_imports(names: tuple[str, ...] = DEFERRED) -> list[str]:
    """Defers each of `names` (a top-level module or "package.module") that is installed and not
    imported yet, its package neither unless that is a namespace package, which runs no code (its
    spec is found without importing the package); returns those deferred."""
    deferred = []
    for name in names:
        package = name.rpartition(".")[0]
        if name in sys.modules or _imported_package(package):
            continue
        if package:
            parent = importlib.util.find_spec(package)
            spec = parent and importlib.machinery.PathFinder.find_spec(name, parent.submodule_search_locations)
        else:
            spec = importlib.util.find_spec(name)
        if spec is None:
            continue
        module = importlib.util.module_from_spec(spec)
        module.__class__ = _Deferred
        _pending.add(name)
        sys.modules[name] = module
        _set_on_package(module)  # an imported namespace package gets the attribute, as in an import
        deferred.append(name)
    return deferred


def _set_on_package(module: types.ModuleType) -> None:
    """Sets a submodule as its package's attribute when the package is imported."""
    package, _, child = module.__name__.rpartition(".")
    if package in sys.modules:
        setattr(sys.modules[package], child, module)


def _imported_package(name: str) -> bool:
    """Whether `name` is imported and has code of its own (a namespace package has none)."""
    module = sys.modules.get(name)
    return module is not None and getattr(module, "__file__", None) is not None
