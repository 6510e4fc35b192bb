"""A command's log: standard error caught at the file descriptor (what C++ code prints too), the
terminal keeping only what a person should read, `-v` copying the log to the terminal, a remote
root's log uploaded at the end, old logs removed, and a config mistake leaving nothing behind."""
from __future__ import annotations

import logging
import os
import sys

import pytest

from pipeline.config import ConfigError
from pipeline.run_log import CommandLog
from tests.conftest import make_config


def speak() -> None:
    """What a command's process writes while it runs, by every route."""
    os.write(2, b"I0000 00:00:1.0 1 cudart_stub.cc:31] a C++ line\n")  # as TensorFlow's C++ logging does
    logging.getLogger("tfx.somewhere").warning("a library warning")
    logging.getLogger("loopline.export").info("an INFO line")
    logging.getLogger("loopline.trainer.progress").info("epoch 1/2 step 6/12")
    logging.getLogger("loopline.tracking").warning("MLflow is slow")
    import warnings

    warnings.warn("a Python warning", UserWarning)


@pytest.fixture
def root_logging():
    """The root logger as `loopline` configures it: a handler on the process's standard error."""
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.__stderr__)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("loopline").setLevel(logging.INFO)
    yield
    root.removeHandler(handler)
    root.setLevel(level)


def test_the_terminal_gets_the_short_lines_and_the_log_everything(tmp_path, capsys, root_logging):
    log = CommandLog("train")
    console = log.open(make_config(tmp_path))
    speak()
    console.begin("Trainer          ")
    console.end("Trainer          ", "  3.0s  12 steps")
    log.close()
    terminal = capsys.readouterr().err
    assert terminal.splitlines() == ["epoch 1/2 step 6/12", "loopline: warning: MLflow is slow",
                                     "Trainer            3.0s  12 steps"]
    [path] = (tmp_path / "logs").glob("train-*.log")
    assert log.path == str(path)
    text = path.read_text()
    for line in ("I0000 00:00:1.0 1 cudart_stub.cc:31] a C++ line", "WARNING tfx.somewhere: a library warning",
                 "INFO loopline.export: an INFO line", "INFO loopline.trainer.progress: epoch 1/2 step 6/12",
                 "UserWarning: a Python warning"):
        assert line in text, line
    os.write(2, b"")  # standard error is the terminal's again (pytest's capture): writing does not fail
    assert sys.stderr is not console


def test_an_error_ends_the_log_with_its_line_and_traceback(tmp_path, root_logging):
    log = CommandLog("run")
    log.open(make_config(tmp_path), "2026-01-02T03:04:05.000006")
    try:
        raise ValueError("bad thing")
    except ValueError as exc:
        log.close(exc, "loopline: error: bad thing")
    text = (tmp_path / "logs" / "2026-01-02T03:04:05.000006.log").read_text()
    assert text.startswith("loopline: error: bad thing\nTraceback") and text.endswith("ValueError: bad thing\n")


def test_verbose_copies_the_log_to_the_terminal(tmp_path, capfd, root_logging):
    log = CommandLog("serve", verbose=True)
    assert log.open(make_config(tmp_path)) is None  # no console of its own: the terminal gets the log
    speak()
    log.close()
    terminal = capfd.readouterr().err
    text = next((tmp_path / "logs").glob("serve-*.log")).read_text()
    assert "a C++ line" in terminal and "INFO loopline.export: an INFO line" in terminal
    assert terminal == text


def test_a_config_mistake_leaves_no_log_and_no_folder(tmp_path, root_logging):
    root = tmp_path / "new" / "root"
    log = CommandLog("run")
    log.open(make_config(root))
    assert (root / "logs").is_dir()
    log.close(ConfigError("data.path: no such file"), discard=True)
    assert not (tmp_path / "new").exists() and log.path is None


def test_only_the_newest_logs_of_the_command_are_kept(tmp_path, root_logging):
    logs = tmp_path / "logs"
    logs.mkdir()
    old_runs = [f"2025-01-0{d}T10:00:00.000001.log" for d in range(1, 5)]
    others = ["train-2025-01-01T10:00:00.000001.log", "notes.txt"]
    for name in old_runs + others:
        (logs / name).write_text("x")
    log = CommandLog("run")
    log.open(make_config(tmp_path, "pipeline.keep_logs=3"), "2026-01-01T10:00:00.000001")
    log.close()
    assert sorted(p.name for p in logs.iterdir()) == sorted(
        [*old_runs[-2:], "2026-01-01T10:00:00.000001.log", *others])


def test_a_remote_roots_log_is_uploaded_at_the_end(root_logging):
    import tensorflow as tf

    root = "ram://loopline-log-test/root"
    log = CommandLog("predict")
    log.open(make_config(root, "pipeline.metadata_path=unused.sqlite"))
    local = log._local
    os.write(2, b"a line for the bucket\n")
    assert not tf.io.gfile.exists(log.path)  # written here until the command ends
    log.close()
    with tf.io.gfile.GFile(log.path) as f:
        assert f.read() == "a line for the bucket\n"
    assert log.path.startswith(f"{root}/logs/predict-") and not os.path.exists(local)
