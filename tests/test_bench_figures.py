"""The README's benchmark lines and docs/benchmarks.md's tables are what bench/figures.py makes of
bench/results/*.json (regenerate: python -m bench.figures)."""
from __future__ import annotations

import json

import pytest

from bench import figures
from bench.figures import Figure


@pytest.mark.parametrize("page", [figures.README, figures.BENCHMARKS_PAGE], ids=lambda p: p.name)
def test_the_committed_pages_show_what_the_results_say(page):
    text = page.read_text()
    for name, body in figures.sections()[page].items():
        assert figures.shown(text, name) == body.strip(), f"{page.name} is stale: run python -m bench.figures"


def test_every_figure_is_in_its_results_file():
    for fig in figures.FIGURES:
        latest, seen = figures.measured(fig)
        assert latest in seen, fig


def _results(tmp_path, runs):
    (tmp_path / "demo.json").write_text(json.dumps({"runs": runs}))
    return tmp_path


def test_targets_are_judged_on_the_latest_run_and_counted_over_the_range(tmp_path, monkeypatch):
    results = _results(tmp_path, [{"ratio": 0.5}, {"ratio": 3.4}, {"ratio": 2.9}])
    monkeypatch.setattr(figures, "FIGURES", [
        Figure("a ratio", "demo", "ratio", target=">= 3"),
        Figure("the same since run 2", "demo", "ratio", target=">= 3", since_run=2, table=figures.CONTEXT),
    ])
    assert figures.table(figures.LIKE_FOR_LIKE, results).splitlines()[2] == (
        "| a ratio | `demo` | 2.90x | 0.50x - 3.40x (3 runs) | >= 3: **missed**; met in 1 of 3 runs |")
    assert figures.table(figures.CONTEXT, results).splitlines()[2] == (
        "| the same since run 2 | `demo` | 2.90x | 2.90x - 3.40x (2 runs from run 2) | >= 3: **missed**; met in 1 of 2 runs |")


def test_list_items_and_a_missing_figure(tmp_path):
    results = _results(tmp_path, [{"sizes": [{"rows": 10, "x": 1.0}, {"rows": 100, "x": 2.0}]}])
    assert figures.measured(Figure("", "demo", "sizes[-1].x"), results) == (2.0, [2.0])
    assert figures.measured(Figure("", "demo", "sizes[0].x"), results) == (1.0, [1.0])
    with pytest.raises(figures.MissingFigure, match=r"demo.json: the latest run has no number at 'sizes\[2\].x'"):
        figures.measured(Figure("", "demo", "sizes[2].x"), results)



def test_items_by_a_field_and_only_the_runs_holding_a_key(tmp_path):
    """A run that measured other sizes (a 10M-only run) neither hides nor fakes the 1M figure."""
    one_m = {"sizes": [{"rows": 100, "x": 1.0}, {"rows": 1000, "x": 2.0}]}
    results = _results(tmp_path, [one_m, {"sizes": [{"rows": 1000, "x": 3.0}]}, {"sizes": [{"rows": 10000, "x": 9.0}]}])
    assert figures.measured(Figure("", "demo", "sizes[rows=1000].x", runs_with="sizes[rows=1000]"), results) == (3.0, [2.0, 3.0])
    assert figures.measured(Figure("", "demo", "sizes[rows=100].x", runs_with="sizes[rows=100]"), results) == (1.0, [1.0])
    with pytest.raises(figures.MissingFigure, match=r"the latest run has no number at 'sizes\[rows=1000\].x'"):
        figures.measured(Figure("", "demo", "sizes[rows=1000].x"), results)


def test_a_count_is_written_out_of_the_latest_runs_total(tmp_path, monkeypatch):
    """"6 of 7" reads both numbers from the run: a bench that measures 8 tables says "of 8"."""
    results = _results(tmp_path, [{"within": 6, "measured": 7}, {"within": 7, "measured": 8}])
    monkeypatch.setattr(figures, "FIGURES", [Figure("tables", "demo", "within", "{:.0f}", table=None, readme=True,
                                                    out_of="measured")])
    assert figures.readme_lines(results) == "- `demo`: tables: **7 of 8**"
    (tmp_path / "demo.json").write_text(json.dumps({"runs": [{"within": 6}]}))
    with pytest.raises(figures.MissingFigure, match="no number at 'measured'"):
        figures.readme_lines(results)


def test_only_the_runs_where_each_key_has_its_value_or_none(tmp_path):
    """The quality figure reads the docs' split at the defaults: a run on another split, or of a
    variant (QUALITY_SET keys), is passed over; older runs without those keys count."""
    runs = [{"within": 6}, {"within": 5, "split_seed": 0, "set": []}, {"within": 1, "split_seed": 3},
            {"within": 0, "split_seed": 0, "set": ["trainer.ema_decay=0.99"]}]
    fig = Figure("", "demo", "within", "{:.0f}", runs_where=(("split_seed", 0), ("set", [])))
    assert figures.measured(fig, _results(tmp_path, runs)) == (5, [6, 5])
