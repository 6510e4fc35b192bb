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


def test_component_cpu_seconds_are_read_off_the_samples_in_its_window():
    samples = [(0.0, 500 * MB), (1.0, 600 * MB), (2.0, 600 * MB), (3.0, 650 * MB)]
    cpu = [(0.0, 1.0), (1.0, 2.5), (2.0, 4.0), (3.0, 4.2)]
    figures = scale.component_figures({"Trainer": (1.0, 2.0), "Evaluator": (2.0, 3.0)}, samples, cpu)
    assert figures["Trainer"]["cpu_seconds"] == 1.5
    assert figures["Evaluator"]["cpu_seconds"] == 0.2


def test_time_outside_the_components_is_start_up_gaps_and_exit():
    from types import SimpleNamespace

    sampler = SimpleNamespace(samples=[(100.0, MB)], cpu=[(100.0, 0.5), (103.0, 3.0), (104.0, 4.0), (105.0, 4.5),
                                                           (106.0, 5.5), (108.0, 7.0)])
    run = scale.Timed(started=100.0, seconds=10.0, cpu_seconds=9.0, sampler=sampler)
    outside = scale.outside_components(run, {"A": (103.0, 104.0), "B": (105.0, 108.0)})
    assert outside["start-up"] == {"seconds": 3.0, "cpu_seconds": 3.0}  # CPU from the process's start
    assert outside["between components"] == {"seconds": 1.0, "cpu_seconds": 0.5}  # 104 -> 105
    assert outside["after the last"] == {"seconds": 2.0, "cpu_seconds": 2.0}  # 9.0 in all, 7.0 by the last end


def test_the_10m_figures_compare_with_the_1m_run_of_the_same_invocation():
    def size(rows, rss, split):
        return {"rows": rows, "peak_rss_mb": rss, "training_split": split, "example_gen": None,
                **{key: 1.0 for key in scale.RATIOS}}

    figures = scale.headline([size(1_000_000, 1500, "in memory"), size(10_000_000, 2100, "streamed")])
    assert figures["peak_rss_10m_vs_1m"] == 1.4
    assert figures["training_split_10m"] == "streamed"
    assert {"pipeline_vs_script_cpu_1m", "pipeline_vs_lean_script_cpu_1m", "pipeline_vs_script_cpu_10m"} <= set(figures)
    assert "peak_rss_1m_from" not in figures


def test_a_10m_only_run_compares_its_rss_with_the_latest_earlier_1m_run():
    ten = {"rows": 10_000_000, "peak_rss_mb": 1800, "training_split": "streamed", "example_gen": None,
           **{key: 1.0 for key in scale.RATIOS}}
    earlier = [{"label": "old", "date": "d1", "sizes": [{"rows": 1_000_000, "rounds": [], "peak_rss_mb": 900}]},
               {"label": "new", "date": "d2", "sizes": [{"rows": 1_000_000, "rounds": [], "peak_rss_mb": 1500}]},
               {"label": "10M only", "date": "d3", "sizes": [{"rows": 10_000_000, "rounds": [], "peak_rss_mb": 1}]}]
    figures = scale.headline([ten], earlier)
    assert figures["peak_rss_10m_vs_1m"] == 1.2 and figures["peak_rss_1m_from"] == "new of d2"
    assert "peak_rss_10m_vs_1m" not in scale.headline([ten], earlier[2:])  # no 1M run to compare with


def test_the_docs_show_the_tables_generated_from_the_results():
    from tests.conftest import REPO

    runs = scale.read_runs()
    before, after = scale._pair(runs)
    assert before is not None and after is not None, "bench/results/scale.json needs a run labelled before and one after"
    page = (REPO / "docs" / "pipeline-speed.md").read_text()
    shown = page.split(scale.DOCS_START, 1)[1].split(scale.DOCS_END, 1)[0].strip()
    assert shown == scale.markdown(runs).strip(), "regenerate the tables: python -m bench.scale --docs"


def test_a_fork_before_its_exec_is_not_counted_twice():
    import subprocess
    import sys

    # 200 MB, then a fork that sleeps without exec (it shares those pages), then an exec'd child.
    code = ("import os, subprocess, time\nx = bytearray(200 * 2**20)\npid = os.fork()\n"
            "if pid == 0:\n    time.sleep(1.0)\n    os._exit(0)\n"
            "subprocess.run(['sleep', '0.5'])\nos.waitpid(pid, 0)\n")
    process = subprocess.Popen([sys.executable, "-c", code])
    sampler = scale.RssSampler(process.pid, interval=0.02)
    assert process.wait(timeout=60) == 0
    sampler.join()
    peak_mb = max(rss for _, rss in sampler.samples) / 2**20
    assert 200 < peak_mb < 350  # once, not twice
    assert len(sampler.samples) > 20  # an exec'd child that exits does not stop the sampling
