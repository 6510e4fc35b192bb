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
