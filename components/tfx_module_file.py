"""Loads a TFX user's module file (`preprocessing_fn`, `run_fn`, `tuner_fn`) unchanged.

TFX's module files start with `from tfx import v1 as tfx`. Here that import fails: `tfx.v1`
imports `tfx.v1.extensions`, whose Google Cloud trainer imports TensorFlow Data Validation, which
has no wheel for this stack. Nothing a module file uses lives in the extensions, so an empty
stand-in for `tfx.v1.extensions` lets `tfx.v1` import with its real `components` (FnArgs,
DataAccessor, TunerFnResult), `dsl`, `proto`, `types` and `utils`.
"""
from __future__ import annotations

import sys
import types
from typing import Callable

EXTENSIONS = "tfx.v1.extensions"


class ModuleFileError(ValueError):
    """A module file that cannot be loaded or lacks the function asked for; names the file."""


def _extensions_stand_in() -> types.ModuleType:
    module = types.ModuleType(EXTENSIONS, "Stand-in: TFX's extensions need TensorFlow Data Validation.")

    def missing(name: str):
        raise ImportError(f"tfx.v1.extensions.{name} is not available: TFX's extensions need TensorFlow Data "
                          "Validation, which does not install with this stack")

    module.__getattr__ = missing
    return module


def import_tfx_v1() -> types.ModuleType:
    """`tfx.v1`, with the extensions' stand-in when the real ones cannot import."""
    try:
        from tfx import v1
    except ImportError as exc:
        if exc.name != "tensorflow_data_validation":
            raise
        sys.modules[EXTENSIONS] = _extensions_stand_in()
        from tfx import v1
    return v1


def module_function(module_file: str, name: str, *, required: bool = True) -> Callable | None:
    """`name` from `module_file`, loaded as TFX's executors load it (once per path); None when
    absent and not `required`."""
    from tfx.utils import import_utils

    import_tfx_v1()  # before the module's own `from tfx import v1 as tfx`
    try:
        return import_utils.import_func_from_source(module_file, name)
    except AttributeError:
        if required:
            raise ModuleFileError(f"{module_file}: has no function {name!r}") from None
        return None
    except (ImportError, OSError, SyntaxError) as exc:
        raise ModuleFileError(f"{module_file}: cannot be loaded ({type(exc).__name__}: {exc})") from exc
