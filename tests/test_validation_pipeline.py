"""Real LocalDagRunner runs: bad data stops the pipeline before training with the feature named
and nothing pushed; a clean dataset of another shape (regression label) runs end to end."""
import csv
import os
import random

import pytest

from conftest import REPO, make_config
from pipeline.local_runner import run_local
from validation.anomalies import DataAnomaliesError

pytestmark = pytest.mark.slow

SCHEMA = str(REPO / "data" / "penguins.schema.pbtxt")


def penguin_rows():
    with open(REPO / "data" / "penguins.csv", newline="") as f:
        return list(csv.DictReader(f))


def write_csv(path, rows, columns=None):
    columns = columns or list(rows[0])
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return str(path)


def assert_stopped(tmp_path, feature, *overrides):
    config = make_config(tmp_path / "ws", "trainer.epochs=1", *overrides)
    with pytest.raises(DataAnomaliesError) as caught:
        run_local(config)
    report = str(caught.value)
    assert f"] {feature}: '{feature}'" in report
    assert "stopped before training" in report
    serving = tmp_path / "ws" / "serving"
    assert not serving.exists() or not any(serving.rglob("saved_model.pb"))
    assert not (tmp_path / "ws" / "tfx" / "Trainer").exists()  # training never started
    return report


def test_missing_column_stops_against_curated_schema(tmp_path):
    rows = penguin_rows()
    data = write_csv(tmp_path / "p.csv", rows, [c for c in rows[0] if c != "island"])
    report = assert_stopped(tmp_path, "island", f"data.path={data}", f"data.schema={SCHEMA}")
    assert "SCHEMA_MISSING_COLUMN" in report


def test_text_in_numeric_column_stops_in_a_first_run(tmp_path, capsys):
    from pipeline.cli import main

    rows = penguin_rows()
    rows[7]["body_mass_g"] = "heavy"
    rows[40]["body_mass_g"] = "?"
    data = write_csv(tmp_path / "p.csv", rows)
    common = ["--config", str(REPO / "loopline.yaml"), "--set", f"pipeline.root={tmp_path / 'ws'}"]
    code = main(["run", *common, "--set", "trainer.epochs=1", "--set", f"data.path={data}"])
    err = capsys.readouterr().err
    assert code == 1
    assert "] body_mass_g: 'body_mass_g' is a numeric column" in err and "'heavy'" in err and "'?'" in err
    assert not (tmp_path / "ws" / "tfx" / "Trainer").exists()
    # The stopped run's anomalies stay readable: the data report shows them.
    assert main(["data", "report", *common, "--out", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "index.html").read_text()
    assert "no anomalies" not in page and "heavy" in page and 'class="bad"' in page
    # A first run has no baseline: its problems are within the run, which acceptance cannot let through.
    capsys.readouterr()
    assert main(["data", "accept", *common]) == 2
    assert "stopped by problems within the run" in capsys.readouterr().err
    assert not (tmp_path / "ws" / "baseline").exists()


def test_unseen_category_stops_against_curated_schema(tmp_path):
    rows = penguin_rows()
    for row in rows[::30]:
        row["island"] = "Atlantis"
    data = write_csv(tmp_path / "p.csv", rows)
    report = assert_stopped(tmp_path, "island", f"data.path={data}", f"data.schema={SCHEMA}")
    assert "'Atlantis'" in report and "ENUM_TYPE_UNEXPECTED_STRING_VALUES" in report
    # Accepting it never edits the curated file: it prints the diff to apply by hand.
    from pipeline.data_accept import accept_data

    before = open(SCHEMA).read()
    lines = accept_data(make_config(tmp_path / "ws", f"data.path={data}", f"data.schema={SCHEMA}"))
    diff = "\n".join(lines[lines.index(next(x for x in lines if x.startswith("data.schema"))):])
    assert f"--- {SCHEMA}" in diff and '+  value: "Atlantis"' in diff
    assert open(SCHEMA).read() == before


def test_shifted_numeric_distribution_between_splits_stops(tmp_path):
    rows = penguin_rows()
    random.Random(0).shuffle(rows)
    train, evaluation = rows[:230], rows[230:]
    for row in evaluation:
        if row["flipper_length_mm"]:
            row["flipper_length_mm"] = str(int(row["flipper_length_mm"]) + 60)
    (tmp_path / "in").mkdir()
    train_csv = write_csv(tmp_path / "in" / "train.csv", train)
    eval_csv = write_csv(tmp_path / "in" / "eval.csv", evaluation)
    report = assert_stopped(tmp_path, "flipper_length_mm", f"data.path={train_csv}", f"data.eval_path={eval_csv}")
    assert "Jensen-Shannon" in report
    assert "body_mass_g" not in report  # the unshifted columns pass


def test_warn_only_trains_despite_anomalies(tmp_path):
    rows = penguin_rows()
    rows[7]["body_mass_g"] = "heavy"
    data = write_csv(tmp_path / "p.csv", rows)
    # The generic model takes the broken column as a string feature; the default multi-task module
    # declares body_mass_g a regression label and refuses it, naming the label.
    config = make_config(tmp_path / "ws", "trainer.epochs=1", f"data.path={data}", "validation.warn_only=true",
                         "trainer.module_file=null")
    summary = run_local(config)
    assert summary.version is not None
    assert summary.executions["ExampleValidator"] == "COMPLETE"
    strict = make_config(tmp_path / "ws2", "trainer.epochs=1", f"data.path={data}", "validation.warn_only=true")
    with pytest.raises(ValueError, match="label 'body_mass_g': the model module declares regression, but the data holds strings"):
        run_local(strict)


def test_other_dataset_with_a_regression_label_runs_end_to_end(tmp_path):
    rng = random.Random(1)
    rows = []
    for _ in range(300):
        rooms, area = rng.randint(1, 6), rng.uniform(20, 200)
        city = rng.choice(["north", "south", "east"])
        price = 1000 + 12.5 * area + 300 * rooms + (500 if city == "north" else 0) + rng.gauss(0, 50)
        rows.append({"rooms": rooms, "area": f"{area:.1f}", "city": city, "price": f"{price:.2f}"})
    data = write_csv(tmp_path / "houses.csv", rows)
    config = make_config(tmp_path / "ws", "trainer.epochs=1", f"data.path={data}", "data.label=price")
    summary = run_local(config)
    assert summary.version is not None
    assert os.path.isfile(os.path.join(summary.pushed_path, "saved_model.pb"))
    assert "price_rmse" in summary.metrics
    assert summary.executions["DataGate"] == "COMPLETE"

    # The human view of that run: a page naming every column, and one histogram each.
    from pipeline.data_report import data_report

    page = data_report(config, str(tmp_path / "report"))
    text = open(page).read()
    assert "no anomalies" in text
    for column in ("rooms", "area", "city", "price"):
        assert f"<td>{column}</td>" in text
        assert (tmp_path / "report" / f"{column}.png").stat().st_size > 1000
