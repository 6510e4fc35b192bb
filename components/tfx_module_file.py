"""Loads a TFX user's module file (`preprocessing_fn`, `run_fn`, `tuner_fn`) unchanged.

TFX's module files start with `from tfx import v1 as tfx`. Here that import fails: `tfx.v1`
imports `tfx.v1.extensions`, whose Google Cloud trainer imports TensorFlow Data Validation, which
has no wheel for this stack. Nothing a module file uses lives in the extensions, so a stand-in
for `tfx.v1.extensions` lets `tfx.v1` import with its real `components` (FnArgs, DataAccessor,
TunerFnResult), `dsl`, `proto`, `types` and `utils`. A component `tfx.v1.components` imports
optionally that fails otherwise than with an ImportError (TFX's Evaluator under `loopline run`,
which defers TensorFlow Model Analysis: pipeline/deferred_imports.py) is left None as well.
"""
from __future__ import annotations

import contextlib
import re
import sys
import types
from typing import Callable

EXTENSIONS = "tfx.v1.extensions"


class ModuleFileError(ValueError):
    """A module file that cannot be loaded or lacks the function asked for; names the file."""


def _stand_in(name: str, why: str) -> types.ModuleType:
    """A module whose every attribute read raises ImportError(`why`): `from name import X` then
    fails as the import `tfx.v1` guards does, and a user who touches it is told why. A module
    attribute (`__file__`, `__path__`...) it lacks is an AttributeError, as for any module: code
    that scans sys.modules with `getattr(module, "__file__", None)` (inspect.getmodule, and so
    TensorFlow's autograph) must not fail on it."""
    module = types.ModuleType(name, why)

    def missing(attribute: str):
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)
        raise ImportError(f"{name}.{attribute} is not available: {why}")

    module.__getattr__ = missing
    return module


def _optional_components() -> list[str]:
    """The component modules `tfx.v1.components` imports inside `try: ... except ImportError`
    (read from its source, so the list is TFX's own)."""
    import ast
    import importlib.util
    import os

    # Its file, found without importing tfx.v1 (which would import them).
    path = os.path.join(os.path.dirname(importlib.util.find_spec("tfx").origin), "v1", "components", "__init__.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return [node.module for guarded in tree.body if isinstance(guarded, ast.Try)
            for node in ast.walk(guarded) if isinstance(node, ast.ImportFrom) and node.module]


def _guard_optional_components() -> None:
    """A component module that fails with another error than ImportError (TFX's Evaluator, when
    TensorFlow Model Analysis was loaded without its top-level config names) gets a stand-in,
    so that `tfx.v1.components` leaves it None as it does a component that does not install."""
    import importlib

    for name in _optional_components():
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # tfx.v1.components handles it
        except Exception as exc:  # noqa: BLE001 - any other failure makes that one component unavailable
            sys.modules[name] = _stand_in(name, f"it does not import here ({type(exc).__name__}: {exc})")


def import_tfx_v1() -> types.ModuleType:
    """`tfx.v1`, with stand-ins for what cannot import here (the extensions, which need TFDV)."""
    if "tfx.v1" in sys.modules:
        return sys.modules["tfx.v1"]
    _guard_optional_components()
    try:
        from tfx import v1
    except ImportError as exc:
        if exc.name != "tensorflow_data_validation":
            raise
        sys.modules[EXTENSIONS] = _stand_in(EXTENSIONS, "TFX's extensions need TensorFlow Data Validation, which "
                                                        "does not install with this stack")
        from tfx import v1
    return v1


def module_function(module_file: str, name: str, *, required: bool = True) -> Callable | None:
    """`name` from `module_file`, loaded as TFX's executors load it (once per path, with TFX's
    Keras: tfx_keras); None when absent and not `required`."""
    from tfx.utils import import_utils

    import_tfx_v1()  # before the module's own `from tfx import v1 as tfx`
    try:
        with tfx_keras():
            return import_utils.import_func_from_source(module_file, name)
    except AttributeError:
        if required:
            raise ModuleFileError(f"{module_file}: has no function {name!r}") from None
        return None
    except (ImportError, OSError, SyntaxError) as exc:
        raise ModuleFileError(f"{module_file}: cannot be loaded ({type(exc).__name__}: {exc})") from exc


@contextlib.contextmanager
def tfx_keras():
    """`tf.keras` as Keras 2 (tf_keras) for the `with` block, the Keras a TFX module gets from TFX:
    tensorflow_transform sets TF_USE_LEGACY_KERAS when it is imported, which decides `tf.keras` if
    nothing read it before. A process that read it first (a script or notebook that used Keras 3
    through `tf.keras` before calling run_local) keeps Keras 3 there, and a run_fn's Keras 3 model
    saved with `tf.saved_model.save` does not restore in a TF1 Session, as TF Serving calls it
    (`Could not find variable dense_1/kernel`). module_function imports a module in the block,
    and its functions are called in one, so its `tf.keras`, `from tensorflow import keras` and
    `from tensorflow.keras[.<submodule>] import ...` are Keras 2 either way; all are put back after. The swap is the process's: what
    else runs in the block (Beam's workers for a preprocessing_fn) sees it too."""
    import tensorflow as tf
    import tf_keras.api._v2.keras as keras_2  # what TensorFlow's loader gives under TF_USE_LEGACY_KERAS

    modules = {"tensorflow.keras": keras_2}
    modules.update({f"tensorflow.keras.{name}": value for name, value in vars(keras_2).items()
                    if isinstance(value, types.ModuleType) and not name.startswith("_")})
    before, before_modules = vars(tf)["keras"], {name: sys.modules.get(name) for name in modules}
    tf.keras = keras_2
    sys.modules.update(modules)
    try:
        yield
    finally:
        tf.keras = before
        for name, module in before_modules.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


@contextlib.contextmanager
def keras_tuner_on_module_keras():
    """TFX's Keras (tfx_keras) with KerasTuner bound to it, for the `with` block.

    A TFX module's `tf.keras` is Keras 2 (tf_keras), while KerasTuner binds itself to the `keras`
    package (Keras 3 here) when it is imported, and refuses a Keras 2 model ("a valid Keras Model
    instance") and its fit's History. Its engine reads Keras through one module,
    `keras_tuner.src.backend.keras`: that module's names are Keras 2's in the block (as KerasTuner
    sets them when `keras` is Keras 2), and are put back after; `tuner_utils`, whose callbacks
    subclass Keras' Callback when it is imported, is imported again on each change."""
    import importlib

    import tensorflow as tf
    from keras_tuner.src.backend import config, keras as backend_keras
    from keras_tuner.src.engine import tuner_utils

    with tfx_keras():
        module_keras = tf.keras
        saved, saved_multi = dict(vars(backend_keras)), config._MULTI_BACKEND
        try:
            vars(backend_keras).update({name: getattr(module_keras, name) for name in dir(module_keras)
                                        if not name.startswith("_")})
            config._MULTI_BACKEND = False
            importlib.reload(tuner_utils)
            yield
        finally:
            vars(backend_keras).clear()
            vars(backend_keras).update(saved)
            config._MULTI_BACKEND = saved_multi
            importlib.reload(tuner_utils)


# A Keras progress bar's state before its last step ("  286/300 [=====>..] - ETA: 0s - loss: ...").
_UNFINISHED_BAR = re.compile(r"\s*(\d+)/(\d+) \[")


class _PrintedLines:
    """A stdout whose finished lines go to a logger: a progress bar's rewrites (carriage returns,
    backspaces) leave only a line's last state, and a Keras bar's states before its last step are
    left out (its final line, with the epoch's figures, is logged)."""

    def __init__(self, logger):
        self._logger, self._line = logger, []

    def write(self, text: str) -> int:
        for char in text:
            if char == "\n":
                self.flush()
            elif char == "\r":
                self._line = []
            elif char == "\b":
                self._line = self._line[:-1]
            else:
                self._line.append(char)
        return len(text)

    def flush(self) -> None:
        line = "".join(self._line).rstrip()
        self._line = []
        bar = _UNFINISHED_BAR.match(line)
        if line and not (bar and bar.group(1) != bar.group(2)):
            self._logger.info("%s", line)

    def isatty(self) -> bool:
        return False


@contextlib.contextmanager
def printed_to_log(logger):
    """What a module's function prints (Keras' fit() and KerasTuner's progress, print()) into the
    run's log through `logger`, not onto the console's component lines."""
    lines = _PrintedLines(logger)
    try:
        with contextlib.redirect_stdout(lines):
            yield
    finally:
        lines.flush()
