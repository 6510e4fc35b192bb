"""The daily-run shape on one pipeline root, through the CLI: a good run sets the baseline; then a
dropped column, a shifted distribution, a new category and a minority of text values in a numeric
column each stop the run before training, naming the feature, with nothing trained or pushed;
then accepted changes (`loopline data accept`, then `validation.accept_changes=true`) train, are
blessed on the thresholds alone when the champion cannot read the new data, and are pushed."""
import json
import time

import pytest

from conftest import REPO
from test_validation_pipeline import penguin_rows, write_csv

pytestmark = pytest.mark.slow


def trained_models(root):
    """Trainer executions that produced a model, and SavedModels pushed to serving."""
    trainer = root / "tfx" / "Trainer" / "model"
    serving = root / "serving"
    return (len(list(trainer.iterdir())) if trainer.exists() else 0,
            len(list(serving.rglob("saved_model.pb"))) if serving.exists() else 0)


def dropped(rows):
    return [{k: v for k, v in row.items() if k != "bill_length_mm"} for row in rows]


def shifted(rows):
    return [{**row, "flipper_length_mm": str(int(row["flipper_length_mm"]) + 60) if row["flipper_length_mm"] else ""}
            for row in rows]


def new_category(rows):
    return [{**row, "island": "Atlantis"} if i % 30 == 0 else row for i, row in enumerate(rows)]


def text_values(rows):
    """One value in seven of bill_length_mm becomes text: below validation.numeric_text_fraction."""
    return [{**row, "bill_length_mm": ("?" if i % 14 == 0 else "unknown")} if i % 7 == 0 else row
            for i, row in enumerate(rows)]


class DailyRuns:
    """`loopline` commands on one root and one data file, printing what each prints (with -s)."""

    def __init__(self, tmp_path, capsys):
        self.root, self.data, self.capsys = tmp_path / "ws", tmp_path / "in" / "penguins.csv", capsys
        self.data.parent.mkdir()
        self.common = ["--config", str(REPO / "loopline.yaml"), "--set", f"pipeline.root={self.root}",
                       "--set", f"data.path={self.data}", "--set", "trainer.epochs=1", "--set", "export.tflite_variants=[]"]
        self.timings = {}

    def cli(self, name, *args, extra=()):
        from pipeline.cli import main

        started = time.monotonic()
        code = main([*args, *self.common, *extra])
        self.timings[name] = time.monotonic() - started
        out = self.capsys.readouterr()
        with self.capsys.disabled():
            print(f"--- {name}: exit {code} in {self.timings[name]:.1f} s\n{out.out}{out.err}")
        return code, out.out + out.err

    def run(self, name, rows, *extra):
        if rows is not None:  # None: the same file as the run before, untouched
            write_csv(self.data, rows, list(rows[0]))
        return self.cli(name, "run", extra=extra)


def test_daily_runs_on_one_root(tmp_path, capsys):
    from pipeline.config import load_config
    from pipeline.tracking_setup import tracking_target
    from tracking.target import make_client

    days = DailyRuns(tmp_path, capsys)
    root, run = days.root, days.run
    good = penguin_rows()
    code, text = run("good run", good)
    assert code == 0 and "no baseline yet (first run on this root)" in text and "blessing   blessed" in text
    assert (root / "baseline" / "penguins" / "CURRENT.json").is_file()
    assert trained_models(root) == (1, 1)

    for name, rows, feature, kind in [
        ("dropped column", dropped(good), "bill_length_mm", "SCHEMA_MISSING_COLUMN"),
        ("shifted distribution", shifted(good), "flipper_length_mm", "COMPARATOR_JENSEN_SHANNON_DIVERGENCE_HIGH"),
        ("new category", new_category(good), "island", "ENUM_TYPE_UNEXPECTED_STRING_VALUES"),
        ("text in a numeric column", text_values(good), "bill_length_mm", "FLOAT_TYPE_STRING_NOT_FLOAT"),
    ]:
        code, text = run(name, rows)
        assert code == 1, name
        assert f"] {feature}: '{feature}'" in text and kind in text, name
        assert "stopped before training" in text and "loopline data accept" in text, name
        assert trained_models(root) == (1, 1), f"{name}: something was trained or pushed"
    assert "'?'" in text and "'unknown'" in text  # the text scenario quotes the values
    assert "'Atlantis'" not in text and "body_mass_g" not in text  # each stop names its own feature

    # The text change is intended: accept the stopped run's data, then run again on it.
    code, accepted = days.cli("data accept", "data", "accept")
    assert code == 0 and "FLOAT_TYPE_STRING_NOT_FLOAT" in accepted and "~ bill_length_mm: type FLOAT -> BYTES" in accepted
    # Three epochs: with a bill length turned to text, one epoch's body-mass head beats the mean by
    # about 5%, within the 114 eval rows' chance (one standard error), and the floor refuses it.
    code, text = run("accepted change", None, "--set", "trainer.epochs=3")
    assert code == 0 and "blessing   blessed" in text
    # The unchanged file's examples come from the cache; the checks made before the acceptance do not.
    assert "CsvExampleGen: CACHED" in text and "SchemaGen: COMPLETE" in text
    assert "blessed on the thresholds alone (the data changed on purpose: loopline data accept" in text
    assert "could not be evaluated" in text  # the champion cannot parse text in bill_length_mm
    assert trained_models(root) == (2, 2)

    # The same, for one run, with validation.accept_changes=true: numbers are back in
    # bill_length_mm and flipper lengths shifted; the new champion reads bill_length_mm as text.
    code, text = run("accept_changes", shifted(good), "--set", "validation.accept_changes=true")
    assert code == 0 and "changes accepted (validation.accept_changes" in text and "flipper_length_mm" in text
    assert "blessed on the thresholds alone" in text and trained_models(root) == (3, 3)

    client = make_client(tracking_target(load_config(REPO / "loopline.yaml", [f"pipeline.root={root}"])))
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    tags = sorted(r.data.tags["loopline.accepted_changes"] for r in runs if "loopline.accepted_changes" in r.data.tags)
    assert len(runs) == 3 and len(tags) == 2
    assert tags[0].startswith("loopline data accept: run ") and tags[1].startswith("validation.accept_changes: ")

    # Nothing to accept after a run that trained.
    code, text = days.cli("nothing to accept", "data", "accept")
    assert code == 2 and "was not stopped by data validation: nothing to accept" in text

    # The report of that run: the baseline next to the new data.
    assert days.cli("data report", "data", "report", "--out", str(tmp_path / "report"))[0] == 0
    page = (tmp_path / "report" / "index.html").read_text()
    assert "drift against the baseline" in page and "baseline train" in page
    assert "~ bill_length_mm: type BYTES -&gt; FLOAT" in page
    # A baseline that cannot be read stops the next run, naming the file (never "no baseline").
    (root / "baseline" / "penguins" / "CURRENT.json").write_text("{truncated")
    code, text = run("unreadable baseline", good)
    assert code == 1 and "CURRENT.json cannot be read" in text and trained_models(root) == (3, 3)
    with capsys.disabled():
        print("timings (s): " + json.dumps({k: round(v, 1) for k, v in days.timings.items()}))
