"""The serving bench's comparison with the no-model gRPC server: the headline figures are the
medians over the rounds of each round's own difference and ratio."""
from __future__ import annotations

import json
import time

import pytest

from bench.serving import floor_medians, measure, previous_runs


def _round(ours_p50, floor_p50, ours_rps, floor_rps, ours_cpu=300.0, floor_cpu=150.0):
    return {"loopline_grpc": {"c1": {"p50_ms": ours_p50}, "c16": {"req_per_s": ours_rps, "server_cpu_us_per_request": ours_cpu}},
            "grpc_floor": {"c1": {"p50_ms": floor_p50}, "c16": {"req_per_s": floor_rps, "server_cpu_us_per_request": floor_cpu}},
            "p50_over_floor_ms_c1": round(ours_p50 - floor_p50, 3), "req_per_s_fraction_c16": round(ours_rps / floor_rps, 3)}


def test_floor_figures_are_medians_of_each_rounds_own_comparison():
    rounds = [_round(0.40, 0.30, 3000, 6000), _round(0.50, 0.45, 1000, 1000), _round(0.90, 0.60, 4000, 5000)]
    figures = floor_medians(rounds)
    # Of 0.10, 0.05, 0.30; the difference of the medians would be 0.50 - 0.45.
    assert figures["p50_over_floor_ms_c1"] == pytest.approx(0.10)
    # Of 0.5, 1.0, 0.8; the ratio of the medians would be 3000 / 5000.
    assert figures["req_per_s_fraction_of_floor_c16"] == pytest.approx(0.8)
    assert figures["floor_p50_ms_c1"] == pytest.approx(0.45) and figures["floor_req_per_s_c16"] == pytest.approx(5000)


def test_server_cpu_per_request_is_the_median_of_each_sides_rounds():
    rounds = [_round(0.4, 0.3, 1, 1, ours_cpu=310, floor_cpu=150), _round(0.4, 0.3, 1, 1, ours_cpu=290, floor_cpu=170),
              _round(0.4, 0.3, 1, 1, ours_cpu=400, floor_cpu=140)]
    assert floor_medians(rounds)["server_cpu_us_per_request_c16"] == {"loopline_grpc": 310, "grpc_floor": 150}


def test_the_inline_floor_is_the_median_of_its_own_rounds():
    rounds = [_round(0.4, 0.3, 1, 1), _round(0.4, 0.3, 1, 1), _round(0.4, 0.3, 1, 1)]
    for r, (p50, rps, cpu) in zip(rounds, [(0.20, 9000, 60), (0.35, 7000, 90), (0.25, 8000, 70)]):
        r["inline_floor"] = {"c1": {"p50_ms": p50}, "c16": {"req_per_s": rps, "server_cpu_us_per_request": cpu}}
    figures = floor_medians(rounds)
    assert (figures["inline_floor_p50_ms_c1"], figures["inline_floor_req_per_s_c16"]) == (0.25, 8000)
    assert figures["server_cpu_us_per_request_c16"]["inline_floor"] == 70
    assert "inline_floor_p50_ms_c1" not in floor_medians([_round(0.4, 0.3, 1, 1)])  # rounds from before it



def test_the_cached_answer_server_is_compared_with_the_floor_round_by_round():
    rounds = [_round(0.4, 0.3, 1, 1), _round(0.4, 0.3, 1, 1), _round(0.4, 0.3, 1, 1)]
    for r, (p50, rps, cpu) in zip(rounds, [(0.33, 900, 100), (0.40, 700, 120), (0.36, 1000, 110)]):
        r["loopline_grpc_cached_answer"] = {"c1": {"p50_ms": p50}, "c16": {"req_per_s": rps, "server_cpu_us_per_request": cpu}}
        r["cached_answer_p50_over_floor_ms_c1"] = round(p50 - r["grpc_floor"]["c1"]["p50_ms"], 3)
        r["cached_answer_req_per_s_fraction_c16"] = rps / 1000
    figures = floor_medians(rounds)
    assert figures["cached_answer_p50_over_floor_ms_c1"] == pytest.approx(0.06)
    assert figures["cached_answer_req_per_s_fraction_c16"] == pytest.approx(0.9)
    assert figures["server_cpu_us_per_request_c16"]["loopline_grpc_cached_answer"] == 110
    assert "cached_answer_req_per_s_fraction_c16" not in floor_medians([_round(0.4, 0.3, 1, 1)])  # rounds from before it

def test_measure_divides_the_servers_cpu_in_its_window_by_the_requests_answered():
    # A stand-in server whose CPU clock advances 1 ms per request: the figure must read ~1000 us,
    # whatever the warm-up before the window (counted in, it would read over 2500 us). Loose: on a
    # loaded machine the two readings may come a few requests late.
    used = [0.0]

    def call():
        used[0] += 0.001
        time.sleep(0.002)

    result = measure(call, 2, seconds=0.5, cpu=lambda: used[0])
    assert result["requests"] > 100
    assert result["server_cpu_us_per_request"] == pytest.approx(1000, rel=0.2)


def test_previous_runs_are_one_headline_entry_per_run_not_whole_results(tmp_path):
    first, second = {"at": "2026-12-01T10:00:00Z", "x": 1}, {"at": "2026-12-01T11:00:00Z", "x": 2}
    whole_first = {"in_process": {}, "runs": [first]}
    # An older file: the second result's list also holds the whole first result.
    whole_second = {"in_process": {}, "runs": [whole_first, second]}
    path = tmp_path / "serving.json"
    path.write_text(json.dumps({"runs": [whole_first, whole_second]}))
    assert previous_runs(path) == [first, second]
    assert previous_runs(tmp_path / "missing.json") == []
