"""The model card of a pushed version and `loopline lineage`: written by the pipeline into the
version folder and MLflow, naming the run's data, commit and MLflow run; per-slice metrics in
MLflow; rendered safely; kept and removed with its version; opened in a headless browser."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _card(summary) -> Path:
    from tracking.model_card import card_folder

    return Path(card_folder(summary.pushed_path))


def _client(config):
    from pipeline.tracking_setup import tracking_target
    from tracking.target import make_client

    return make_client(tracking_target(config))


def _registered(config, summary):
    from tracking.registration import TAG_SERVING_VERSION

    versions = _client(config).search_model_versions(f"name = '{config.serving.model_name}'")
    return next(v for v in versions if v.tags.get(TAG_SERVING_VERSION) == summary.version)


def _cli(config, *argv: str) -> int:
    from pipeline.cli import main

    return main([*argv, "--config", str(REPO / "loopline.yaml"), "--set", f"pipeline.root={config.pipeline.root}"])


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC
    return struct.unpack(">II", data[16:24])  # the IHDR chunk: width, height


def test_pipeline_writes_the_card_beside_the_push_and_into_mlflow(pipeline_run):
    config, summary = pipeline_run
    folder = _card(summary)
    names = {p.name for p in folder.iterdir()}
    assert {"model_card.html", "model_card.md", "model_card.json", "training_curves.png"} <= names
    card = json.loads((folder / "model_card.json").read_text())
    registered = _registered(config, summary)
    lineage = card["lineage"]
    assert lineage["mlflow"]["run_id"] == registered.run_id
    assert lineage["mlflow"]["registered_version"] == str(registered.version)
    data_hash = hashlib.sha256(Path(config.data.path).read_bytes()).hexdigest()
    assert [f["sha256"] for f in lineage["data"]["files"]] == [data_hash]
    run = _client(config).get_run(registered.run_id)
    assert lineage["git_commit"] and lineage["git_commit"] == run.data.tags["loopline.git_commit"]
    assert sorted(card["blessing"]["reasons"]) == sorted(summary.blessing_reasons)
    page = (folder / "model_card.html").read_text()
    for text in (registered.run_id, data_hash, lineage["git_commit"], summary.blessing_reasons[0][:40]):
        assert text in page
    logged = {os.path.basename(a.path) for a in _client(config).list_artifacts(registered.run_id, "model_card")}
    assert names <= logged


def test_slice_metrics_are_logged_under_mlflow_names(pipeline_run):
    from trainer.slicing import SLICES_JSON

    config, summary = pipeline_run
    card = json.loads((_card(summary) / "model_card.json").read_text())
    if not os.path.exists(os.path.join(card["lineage"]["blessing"]["uri"], SLICES_JSON)):
        pytest.skip("this Evaluator writes no slices.json")
    metrics = _client(config).get_run(_registered(config, summary).run_id).data.metrics
    overall = next(s for s in card["slices"]["slices"] if s["slice"] == "Overall")
    assert metrics["slice/Overall/species_accuracy"] == pytest.approx(overall["candidate"]["species_accuracy"])


def test_lineage_json_matches_ml_metadata(pipeline_run, capsys):
    from pipeline.run_metadata import open_store, run_artifacts, run_context

    config, summary = pipeline_run
    assert _cli(config, "lineage", config.serving.model_name, summary.version, "--json") == 0
    lineage = json.loads(capsys.readouterr().out)
    store = open_store(config, read_only=True)
    newest = run_artifacts(store, run_context(store, summary.run_id))
    for key, type_name in (("pushed", "PushedModel"), ("model_artifact", "Model"), ("blessing", "ModelBlessing"),
                           ("statistics", "ExampleStatistics"), ("schema", "Schema"),
                           ("data_baseline", "ExampleAnomalies"), ("trainer_run", "ModelRun")):
        assert (lineage[key]["mlmd_id"], lineage[key]["uri"]) == (newest[type_name].id, newest[type_name].uri), key
    assert lineage["data"]["examples"]["mlmd_id"] == newest["Examples"].id
    assert lineage["pipeline"]["run_id"] == summary.run_id
    assert lineage["config"]["trainer.epochs"] == "3"
    card = json.loads((_card(summary) / "model_card.json").read_text())["lineage"]
    assert {k: v for k, v in lineage.items() if k != "mlflow"} == {k: v for k, v in card.items() if k != "mlflow"}
    assert lineage["mlflow"]["run_id"] == card["mlflow"]["run_id"]


def test_card_command_writes_where_asked_and_names_a_missing_version_in_one_line(pipeline_run, tmp_path, capsys):
    config, summary = pipeline_run
    assert _cli(config, "card", config.serving.model_name, "--out", str(tmp_path / "card")) == 0
    assert str(tmp_path / "card" / "model_card.html") in capsys.readouterr().out
    assert (tmp_path / "card" / "training_curves.png").read_bytes()[:8] == PNG_MAGIC
    assert _cli(config, "card", config.serving.model_name, "17") == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("loopline: error:") and "no pushed version 17" in err and "\n" not in err
    assert _cli(config, "lineage", "no_such_model", "1") == 1
    assert "no_such_model" in capsys.readouterr().err


def test_retention_removes_the_card_with_its_version(tmp_path):
    from serving.retention import apply_retention
    from tracking.model_card import card_folder

    base = tmp_path / "serving" / "m"
    for version in (1, 2, 3):
        (base / str(version)).mkdir(parents=True)
        (base / str(version) / "saved_model.pb").write_bytes(b"")
        Path(card_folder(str(base / str(version)))).mkdir(parents=True)
        (Path(card_folder(str(base / str(version)))) / "model_card.html").write_text("card")
    assert apply_retention(str(tmp_path / "serving"), "m", 1, None) == [1, 2]
    assert sorted(p.name for p in base.iterdir() if not p.name.startswith(".")) == ["3"]
    assert (Path(card_folder(str(base / "3"))) / "model_card.html").exists()


HOSTILE = "<script>alert(1)</script>"


def _lineage(blessing_dir: Path) -> dict:
    return {"model": "m", "version": "7", "pushed": {"mlmd_id": 1, "uri": "u", "path": "/serving/m/7"},
            "pipeline": {"name": "p", "run_id": "r"},
            "data": {"patterns": [], "count": 1, "combined_sha256": "c" * 64,
                     "files": [{"path": f"data/{HOSTILE}.csv", "sha256": "a" * 64, "bytes": 3}], "examples": None},
            "statistics": None, "schema": None, "data_baseline": None, "model_artifact": None, "trainer_run": None,
            "blessing": {"mlmd_id": 2, "uri": str(blessing_dir), "blessed": True}, "champion_replaced": None,
            "config": {"data.path": "data/x.csv"}, "git_commit": "abc", "mlflow": {}}


def _slices() -> dict:
    def entry(name, features, examples, gated):
        return {"slice": name, "features": features, "examples": examples, "gated": gated,
                "candidate": {"species_accuracy": 0.9, "species_loss": 0.3}, "champion": None,
                "confusion": {"species": {"classes": ["A", HOSTILE], "matrix": [[3, 1], [0, 4]]}}}

    return {"slicing_specs": [{"feature_keys": ["island"]}], "min_slice_size": 30,
            "slices": [entry("Overall", {}, 140, True), entry("island=Biscoe", {"island": "Biscoe"}, 60, True),
                       entry(f"island={HOSTILE}", {"island": HOSTILE}, 4, False)],
            "calibration": {"species": [{"lower": 0.0, "upper": 0.5, "examples": 40, "mean_prediction": 0.2,
                                         "observed": 0.25},
                                        {"lower": 0.5, "upper": 1.0, "examples": 100, "mean_prediction": 0.8,
                                         "observed": 0.75}]},
            "gates": [{"slice": "island=Biscoe", "metric": "species_accuracy", "candidate": 0.9, "champion": None,
                       "bound": ">= 0.8", "passed": True, "text": "species_accuracy 0.9 >= 0.8"}]}


def _write_blessing(folder: Path, slices: dict | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "blessing.json").write_text(json.dumps({"blessed": True, "reasons": [f"ok {HOSTILE}", "the split's prior"],
                                                      "candidate": {"species_accuracy": 0.9}, "champion": None,
                                                      "champion_path": None, "failed": [], "trivial": {}}))
    if slices is not None:
        from trainer.slicing import SLICES_JSON

        (folder / SLICES_JSON).write_text(json.dumps(slices))


def test_a_card_with_slices_shows_each_slice_and_escapes_what_the_data_says(tmp_path):
    from tracking.model_card import card_content, write_card

    _write_blessing(tmp_path / "blessing", _slices())
    page = Path(write_card(card_content(_lineage(tmp_path / "blessing")), str(tmp_path / "card"))).read_text()
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count('<tr class="slice-row">') == 3
    assert "island=Biscoe" in page and 'id="no-slices"' not in page
    markdown = (tmp_path / "card" / "model_card.md").read_text()
    assert "<script" not in markdown.lower() and "| island=Biscoe | 60 | True |" in markdown
    assert "- the split's prior" in markdown  # quotes stay as they are: only tags need escaping
    width, height = _png_size((tmp_path / "card" / "calibration.png").read_bytes())
    assert width > 200 and height > 200


def test_a_blessing_without_slices_still_gives_a_card(tmp_path):
    from tracking.model_card import card_content, write_card

    _write_blessing(tmp_path / "blessing", None)
    page = Path(write_card(card_content(_lineage(tmp_path / "blessing")), str(tmp_path / "card"))).read_text()
    assert 'id="no-slices"' in page and "No slices were computed" in page
    assert not (tmp_path / "card" / "calibration.png").exists()


def test_slice_names_become_names_mlflow_takes():
    from mlflow.utils.validation import _validate_metric_name

    from tracking.slice_metrics import metric_slice_name, slice_metrics

    assert metric_slice_name("island=Biscoe,sex=male") == "island:Biscoe sex:male"
    assert metric_slice_name("path=a/b") == "path:a_b"
    assert metric_slice_name("..") == "__"
    names = slice_metrics(_slices())
    assert names["slice/island:Biscoe/species_accuracy"] == 0.9
    for name in names:
        _validate_metric_name(name)  # raises on a name MLflow refuses


def _browser() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_browser() is None, reason="no chromium on PATH (make test installs Debian's chromium where apt "
                                               "works): the card is not opened in a browser here")
def test_the_card_renders_in_a_headless_browser(pipeline_run, tmp_path):
    _, summary = pipeline_run
    folder = tmp_path / "card"
    shutil.copytree(_card(summary), folder)
    flags = [_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,1800"]
    dom = subprocess.run([*flags, "--dump-dom", (folder / "model_card.html").as_uri()], capture_output=True,
                         text=True, timeout=120).stdout
    assert f"<title>Model card: penguins version {summary.version}</title>" in dom
    assert 'id="lineage-table"' in dom and 'src="training_curves.png"' in dom
    for image in folder.glob("*.png"):
        width, height = _png_size(image.read_bytes())
        assert width >= 300 and height >= 200, image.name
    subprocess.run([*flags, f"--screenshot={tmp_path / 'shot.png'}", (folder / "model_card.html").as_uri()],
                   capture_output=True, timeout=120, check=True)
    assert _png_size((tmp_path / "shot.png").read_bytes()) == (1200, 1800)


def test_the_card_and_the_data_hashes_go_through_tf_io_gfile(tmp_path):
    import uuid

    import tensorflow as tf

    import tests.ram_filesystem  # noqa: F401  (TensorFlow's ram:// as an object store behaves)
    from tracking.lineage import data_files
    from tracking.model_card import card_content, card_folder, write_card

    root = f"ram://card-{uuid.uuid4().hex[:8]}"
    with tf.io.gfile.GFile(f"{root}/data/penguins.csv", "wb") as f:
        f.write(b"a,b\n1,2\n")
    found = data_files([f"{root}/data/*.csv"])
    assert found["files"][0]["sha256"] == hashlib.sha256(b"a,b\n1,2\n").hexdigest()
    _write_blessing(tmp_path / "blessing", _slices())
    page = write_card(card_content(_lineage(tmp_path / "blessing")), card_folder(f"{root}/serving/m/7"))
    assert page == f"{root}/serving/m/7/assets.extra/model_card/model_card.html"
    with tf.io.gfile.GFile(page) as f:
        assert "island=Biscoe" in f.read()
    assert tf.io.gfile.exists(f"{root}/serving/m/7/assets.extra/model_card/calibration.png")


def test_without_mlflow_the_curves_come_from_the_trainers_tensorboard_files(pipeline_run):
    from tracking.model_card import tensorboard_curves, training_curves

    config, summary = pipeline_run
    lineage = json.loads((_card(summary) / "model_card.json").read_text())["lineage"]
    from_files = tensorboard_curves(lineage["trainer_run"]["uri"])
    from_mlflow = training_curves(_client(config), lineage["mlflow"]["trained_run_id"])
    assert {"train/loss", "eval/loss"} <= set(from_files)
    for name in ("train/loss", "eval/loss"):
        assert [step for step, _ in from_files[name]] == [step for step, _ in from_mlflow[name]]
        assert [v for _, v in from_files[name]] == pytest.approx([v for _, v in from_mlflow[name]], rel=1e-5)


def test_lineage_without_a_reachable_mlflow_keeps_what_ml_metadata_says(pipeline_run, monkeypatch):
    import pipeline.lineage as lineage_module
    from tracking.lineage import lineage_lines

    def unreachable(*_):
        raise ConnectionError("connection refused\nmore")

    config, summary = pipeline_run
    monkeypatch.setattr(lineage_module, "_mlflow_record", unreachable)
    lineage, client = lineage_module.version_lineage(config, config.serving.model_name, int(summary.version))
    assert client is None and lineage["mlflow"] == {"error": "MLflow could not be read: connection refused"}
    assert lineage["pipeline"]["run_id"] == summary.run_id and lineage["model_artifact"]["uri"]
    assert "mlflow     MLflow could not be read: connection refused" in lineage_lines(lineage)
