"""What a newcomer hits first gets one clear line on stderr and exit code 2, before any work."""
import subprocess
import sys
from pathlib import Path

from conftest import subprocess_env
from pipeline.cli import main

REPO = Path(__file__).resolve().parent.parent


def run_cli(capsys, *args):
    code = main(["run", "--config", str(REPO / "loopline.yaml"), *args])
    err = capsys.readouterr().err.strip()
    return code, err


def test_missing_data_path(capsys, tmp_path):
    code, err = run_cli(capsys, "--set", f"data.path={tmp_path}/missing.csv", "--set", f"pipeline.root={tmp_path}/ws")
    assert code == 2
    assert err == f"loopline: error: data.path: no such file: {tmp_path}/missing.csv"
    assert not (tmp_path / "ws").exists()  # nothing was started


def test_csv_without_label_column(capsys, tmp_path):
    csv = tmp_path / "d.csv"
    csv.write_text("a,b\n1,2\n")
    code, err = run_cli(capsys, "--set", f"data.path={csv}", "--set", f"pipeline.root={tmp_path}/ws")
    assert code == 2
    assert "data.label: column 'species' is not in" in err and "['a', 'b']" in err
    assert len(err.splitlines()) == 1


def test_bad_config_key(capsys):
    code, err = run_cli(capsys, "--set", "trainer.lr=0.1")
    assert code == 2
    assert err.startswith("loopline: error: ") and err.endswith("invalid configuration: unknown key 'trainer.lr'")


def test_console_entry_point_reports_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "run", "--config", str(REPO / "loopline.yaml"), "--set", "data.nope=1"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, env=subprocess_env(),
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "unknown key 'data.nope'" in result.stderr


def test_trainer_refusal_is_one_line(capsys, tmp_path):
    """A check inside the trainer (an early-stopping metric the model does not have) ends as one line."""
    code = main(["train", "--config", str(REPO / "loopline.yaml"), "--work-dir", str(tmp_path),
                 "--set", "trainer.early_stopping_metric=auc", "--set", "trainer.epochs=1",
                 "--set", f"pipeline.root={tmp_path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith("loopline: error: trainer.early_stopping_metric 'auc' is not an eval metric")
    assert not any("Traceback" in line for line in err)


def test_serving_cpus_this_machine_lacks(capsys):
    code = main(["serve", "--config", str(REPO / "loopline.yaml"), "--set", "serving.cpus=[4096]"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("loopline: error: serving.cpus=[4096]: not CPUs this process may use")


def test_csv_glob_reads_every_file_header(capsys, tmp_path):
    """data.path may be a glob of CSV files (one table in parts): each file's header is checked."""
    from pipeline.checks import check_data
    from pipeline.config import load_config
    from pipeline.pipeline import _split_input

    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "a.csv").write_text("x,species\n1,A\n")
    (parts / "b.csv").write_text("x,species\n2,B\n")
    config = load_config(REPO / "loopline.yaml", [f"data.path={parts}/*.csv"])
    assert check_data(config) == ["x", "species"]
    base, input_config = _split_input(config.data.path, None, "csv")
    assert (base, input_config.splits[0].pattern) == (str(parts), "*.csv")

    (parts / "c.csv").write_text("x,kind\n3,C\n")
    code, err = run_cli(capsys, "--set", f"data.path={parts}/*.csv", "--set", f"pipeline.root={tmp_path}/ws")
    assert code == 2
    assert f"data.path: {parts}/c.csv has columns ['x', 'kind'], but {parts}/a.csv has ['x', 'species']" in err
    code, err = run_cli(capsys, "--set", f"data.path={tmp_path}/none/*.csv", "--set", f"pipeline.root={tmp_path}/ws")
    assert code == 2 and err == f"loopline: error: data.path: no file matches {tmp_path}/none/*.csv"
    assert not (tmp_path / "ws").exists()


def test_serve_takes_a_serving_root_in_a_bucket_and_names_a_missing_one(capsys, tmp_path, monkeypatch):
    """The serving root is checked through tf.io.gfile: a folder in a bucket (ram:// here) serves."""
    import tensorflow as tf

    from serving import server

    served = []
    monkeypatch.setattr(server, "serve_forever", lambda root, serving: served.append(root) or 0)
    root = "ram://serve-check/serving"
    tf.io.gfile.makedirs(root)
    common = ["--config", str(REPO / "loopline.yaml"), "--set", f"pipeline.root={tmp_path}"]
    assert main(["serve", *common, "--serving-root", root]) == 0 and served == [root]
    assert main(["serve", *common, "--serving-root", "ram://serve-check/missing"]) != 0
    assert "serving root ram://serve-check/missing does not exist; run the pipeline (loopline run) first" in \
        capsys.readouterr().err
