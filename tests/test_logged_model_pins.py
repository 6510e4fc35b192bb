"""MLflow's check of the logged model's pins runs without its map of every installed distribution's
modules (`tracking.logged_model.pins_checked_without_module_map`): a pin that the environment does
not satisfy is still reported, the map is never built, and MLflow's own state is as before after."""
from __future__ import annotations

import logging

import importlib_metadata
import numpy as np
from mlflow.utils import requirements_utils

from tracking.logged_model import _requirements, pins_checked_without_module_map


def _mismatches(pins, caplog):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mlflow"):
        requirements_utils.warn_dependency_requirement_mismatches(pins)
    return " ".join(r.getMessage() for r in caplog.records if "mismatches" in r.getMessage())


def test_the_pins_are_still_checked_but_no_module_map_is_built(monkeypatch, caplog):
    logger = logging.getLogger("mlflow")
    monkeypatch.setattr(logger, "propagate", True)
    monkeypatch.setattr(requirements_utils, "_MODULES_TO_PACKAGES", None)
    monkeypatch.setattr(requirements_utils, "_PACKAGES_TO_MODULES", None)

    def no_scan():
        raise AssertionError("the module map was built")

    monkeypatch.setattr(importlib_metadata, "packages_distributions", no_scan)
    with pins_checked_without_module_map():
        assert _mismatches(_requirements(), caplog) == ""  # the real pins hold
        wrong = _mismatches(["numpy==0.0.1", "tensorflow"], caplog)
    assert f"numpy (current: {np.__version__}, required: numpy==0.0.1)" in wrong
    assert "tensorflow" not in wrong
    assert requirements_utils._MODULES_TO_PACKAGES is None
    assert requirements_utils._PACKAGES_TO_MODULES is None


def test_a_map_already_built_is_left_as_it_is(monkeypatch):
    built = {"numpy": ["numpy"]}
    monkeypatch.setattr(requirements_utils, "_MODULES_TO_PACKAGES", built)
    with pins_checked_without_module_map():
        assert requirements_utils._MODULES_TO_PACKAGES is built
    assert requirements_utils._MODULES_TO_PACKAGES is built
