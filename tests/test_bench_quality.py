"""The quality bench: docs/model-quality.md shows the table generated from bench/results/quality.json,
and the bench runs end to end on one table (the full run is `make bench BENCH=quality`)."""
from __future__ import annotations

import re

import pytest

from bench import quality
from tests.conftest import REPO

START, END = quality.DOCS_START, quality.DOCS_END


def test_the_docs_show_the_table_generated_from_the_results():
    runs = quality.read_runs()
    assert any(r.get("tables_measured") == 7 for r in runs), "no full run in bench/results/quality.json"
    page = (REPO / "docs" / "model-quality.md").read_text()
    assert START in page and END in page
    shown = page.split(START, 1)[1].split(END, 1)[0].strip()
    assert shown == quality.markdown(runs).strip(), "regenerate the table: python -m bench.quality --docs"


@pytest.mark.slow
def test_one_table_end_to_end(tmp_path):
    """wine through `loopline run` (one seed) and scikit-learn on the same CSVs; the trivial floor the
    bench computes with pandas is the one the Evaluator held the model to."""
    table = quality.write_tables(tmp_path / "data", ["wine"])[0]
    entry = quality.measure_table(table, [0], tmp_path)
    run = entry["loopline_runs"][0]
    assert "error" not in run, run
    assert entry["train_rows"] == 124 and entry["eval_rows"] == 54
    assert set(entry["baselines"]) == {"linear", "hist_gradient_boosting"}
    assert entry["baselines"]["linear"] > 0.9
    assert run["blessed"] is True and 1 <= run["exported_epoch"] <= 20
    floor = next(r for r in run["blessing_reasons"] if "for the trivial model" in r)
    evaluator_floor = float(re.search(r"cultivar_loss \S+ vs (\S+) for the trivial model", floor).group(1))
    assert evaluator_floor == pytest.approx(entry["trivial"]["log_loss"], rel=1e-3)
    assert run["accuracy"] > entry["trivial"]["majority_accuracy"] + 0.3
    assert entry["gap"]["allowed"] == pytest.approx(1 / 54, abs=1e-4)  # one eval example is more than a point


def _run(split: int, ours: float, boosted: float, **keys) -> dict:
    """A full run's shape with one accuracy table and one RMSE table (ours 50.0 vs Ridge's 49.0)."""
    tables = {"cancer": {"task": "classification", "metric": "accuracy", "label": "y", "eval_rows": 171,
                         "loopline": ours, "baselines": {"linear": 0.9, "hist_gradient_boosting": boosted}},
              "sugar": {"task": "regression", "metric": "rmse", "label": "z", "eval_rows": 133, "loopline": 50.0,
                        "baselines": {"linear": 49.0, "hist_gradient_boosting": 60.0}}}
    return {"split_seed": split, "seeds": [0, 1, 2], "tables_measured": 7, "tables": tables, "tuner": [], "set": [],
            "commit": "abc1234", "date": "2026-12-08 00:00", **keys}


def test_across_splits_gaps_the_means_of_each_splits_latest_run_at_the_defaults():
    """Split 0 alone misses by 2 points; over five splits the means are 0.9 points apart (within).
    A later run replaces a split's earlier one; Tuner and QUALITY_SET runs do not count."""
    ours = [0.951, 0.961, 0.961, 0.969, 0.945]
    boosted = [0.971, 0.965, 0.965, 0.965, 0.965]
    runs = [_run(split, ours[split], boosted[split]) for split in range(4)]
    assert quality.across_splits(runs) is None  # split 4 has no run yet
    runs += [_run(4, 0.5, 0.965, tuner=["tuner.enabled=true"]), _run(4, 0.5, 0.965, set=["trainer.epochs=1"])]
    assert quality.across_splits(runs) is None
    runs += [_run(4, 0.5, 0.965), _run(4, ours[4], boosted[4])]
    summary = quality.across_splits(runs)
    cancer = summary["tables"]["cancer"]
    assert cancer["per_split"] == ours and cancer["loopline"] == pytest.approx(0.9574)
    assert cancer["best_baseline"] == "hist_gradient_boosting" and cancer["baselines"]["hist_gradient_boosting"] == 0.9662
    assert cancer["gap"]["behind"] == pytest.approx(0.0088) and cancer["gap"]["met"]
    sugar = summary["tables"]["sugar"]
    assert sugar["best_baseline"] == "linear" and sugar["gap"]["behind"] == pytest.approx(50 / 49 - 1, abs=1e-4)
    assert summary["tables_within_target"] == 2 and len(summary["runs"]) == 5
    runs.append(_run(0, 0.90, 0.971))  # split 0 measured again, worse: its latest run counts
    summary = quality.across_splits(runs)
    assert summary["tables"]["cancer"]["per_split"][0] == 0.90 and not summary["tables"]["cancer"]["gap"]["met"]
    assert "0.900, 0.961, 0.961, 0.969, 0.945" in quality.markdown_across_splits(summary)
    assert quality.across_splits(runs, tuner=True) is None  # only split 4 has a Tuner run
    runs += [_run(split, 0.99, 0.971, tuner=["tuner.enabled=true"], seeds=[0, 1]) for split in range(4)]
    tuned = quality.across_splits(runs, tuner=True)
    assert tuned["tables"]["cancer"]["per_split"] == [0.99, 0.99, 0.99, 0.99, 0.5]
    assert quality.across_splits(runs)["tables"]["cancer"]["per_split"][0] == 0.90  # the defaults' own runs
