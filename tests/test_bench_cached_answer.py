"""The serving bench's server with the model's call answered from a cache
(bench/cached_answer_server.py): the model's own answers, the model run once per input shapes."""
from __future__ import annotations

import numpy as np

from bench.cached_answer_server import cache_model_answers
from serving.servable import Servable
from serving.request_limits import RequestLimits
from tests.serving_helpers import export_model


def _rows(n: int, island: bytes = b"Dream") -> dict[str, np.ndarray]:
    return {"bill_length_mm": np.full((n, 1), 40.0, np.float32), "flipper_length_mm": np.full((n, 1), 190.0, np.float32),
            "island": np.array([[island]] * n, dtype=object)}


def test_answers_are_the_models_and_the_model_runs_once_per_shape(tmp_path, monkeypatch):
    servable = Servable("penguins", 1, str(export_model(tmp_path / "1")), None, RequestLimits())
    try:
        dream, biscoe = servable.run("predict_raw", _rows(1)), servable.run("predict_raw", _rows(1, b"Biscoe"))
        assert not np.allclose(dream["scores"], biscoe["scores"])  # the model tells the two rows apart
        monkeypatch.setattr(Servable, "_call", Servable._call)  # restored after the test
        cache_model_answers()
        first = servable.run("predict_raw", _rows(1))
        np.testing.assert_array_equal(first["scores"], dream["scores"])
        # The same shapes: the cached answer, not the model's for the other row.
        np.testing.assert_array_equal(servable.run("predict_raw", _rows(1, b"Biscoe"))["scores"], dream["scores"])
        # Other shapes (a batch of two): the model runs again.
        assert servable.run("predict_raw", _rows(2))["scores"].shape[0] == 2
    finally:
        servable.unload()
