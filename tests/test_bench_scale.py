"""The scale bench's memory figures: a component's memory is its peak over its start, never
negative; growth is read on figures floored at the stated noise floor."""
from __future__ import annotations

from bench import scale

MB = 2**20


def test_component_memory_is_peak_over_start_floored_at_zero():
    samples = [(0.0, 500 * MB), (1.0, 900 * MB), (2.0, 880 * MB), (3.0, 870 * MB), (4.0, 700 * MB), (5.0, 760 * MB)]
    figures = scale.component_figures({"ExampleGen": (0.5, 1.5), "StatisticsGen": (2.5, 4.5), "Evaluator": (4.5, 5.5)}, samples)
    assert figures["ExampleGen"]["memory_mb"] == 400.0  # 900 at its peak, 500 when it started
    assert figures["StatisticsGen"]["memory_mb"] == 0.0  # RSS fell below its start (880): nothing held, not -10
    assert figures["StatisticsGen"]["peak_rss_mb"] == 870
    assert figures["Evaluator"]["memory_mb"] == 60.0


def test_memory_growth_uses_the_floor_and_reports_a_missing_figure():
    floor = scale.MEMORY_FLOOR_MB
    assert scale.memory_growth(100.0, 300.0) == 3.0
    assert scale.memory_growth(0.0, floor) == 1.0  # both within the allocator's noise
    assert scale.memory_growth(0.0, 4 * floor) == 4.0  # growth from nothing is still seen
    assert scale.memory_growth(None, 10.0) is None


def test_sizes_from_the_environment(monkeypatch):
    monkeypatch.setenv("SCALE_ROWS", "20000,2000")
    assert scale.sizes() == [2000, 20000]
    monkeypatch.delenv("SCALE_ROWS")
    monkeypatch.delenv("SCALE_5M", raising=False)
    assert scale.sizes() == [100_000, 1_000_000]


def test_the_latest_export_report_is_the_highest_execution_id(tmp_path):
    """Execution ids sort as numbers: the tolerance study reads run 10's report, not run 9's."""
    from bench.scale import _reports

    for run in (9, 10, 2):
        folder = tmp_path / "tfx" / "Trainer" / "model" / str(run)
        folder.mkdir(parents=True)
        (folder / "export_report.json").write_text("{}")
    assert [p.parent.name for p in _reports(tmp_path)] == ["2", "9", "10"]
