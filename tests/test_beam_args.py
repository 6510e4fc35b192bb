"""pipeline.beam_args reach the Beam-based components: ExampleGen runs on Beam's DirectRunner in
multi-processing mode (SDK workers in subprocesses) and writes every row; a bad runner fails it."""
from __future__ import annotations

import csv
import glob
import os

import pytest

from tests.conftest import REPO, make_config

MULTI_PROCESSING = '["--direct_running_mode=multi_processing","--direct_num_workers=2"]'


def run_example_gen(config) -> None:
    from tfx.orchestration.local.local_dag_runner import LocalDagRunner
    from tfx.orchestration.pipeline import RunOptions

    from pipeline.pipeline import create_pipeline

    # A partial run of the real pipeline: only ExampleGen, with the pipeline's own Beam args.
    LocalDagRunner().run(create_pipeline(config), run_options=RunOptions(to_nodes=["CsvExampleGen"]))


def count_records(pattern: str) -> int:
    import tensorflow as tf

    files = glob.glob(pattern)
    assert files, f"no TFRecords at {pattern}"
    return sum(1 for _ in tf.data.TFRecordDataset(files, compression_type="GZIP"))


@pytest.mark.slow
def test_example_gen_runs_on_direct_runner_multi_processing(tmp_path, monkeypatch):
    from apache_beam.runners.portability import local_job_service

    started = []
    original_run = local_job_service.SubprocessSdkWorker.run

    def spy(self):
        started.append(self._worker_command_line)
        return original_run(self)

    monkeypatch.setattr(local_job_service.SubprocessSdkWorker, "run", spy)
    config = make_config(tmp_path, f"pipeline.beam_args={MULTI_PROCESSING}")
    assert config.pipeline.beam_args == ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]

    run_example_gen(config)

    assert len(started) >= 2, "Beam did not start its SDK workers as subprocesses"
    examples = os.path.join(config.pipeline.root, "tfx", "CsvExampleGen", "examples", "*")
    with open(REPO / "data" / "penguins.csv", newline="") as f:
        rows = sum(1 for _ in csv.reader(f)) - 1
    train = count_records(os.path.join(examples, "Split-train", "*.gz"))
    evaluation = count_records(os.path.join(examples, "Split-eval", "*.gz"))
    assert train + evaluation == rows
    assert train > evaluation > 0  # the 2:1 split
    # Nothing else of the pipeline ran.
    assert not os.path.exists(os.path.join(config.pipeline.root, "tfx", "Trainer"))


@pytest.mark.slow
def test_beam_args_are_what_example_gen_runs_with(tmp_path):
    config = make_config(tmp_path, 'pipeline.beam_args=["--runner=NoSuchRunnerForLoopline"]')
    with pytest.raises(Exception, match="NoSuchRunnerForLoopline"):
        run_example_gen(config)


def test_beam_args_must_be_flags():
    from pipeline.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"pipeline\.beam_args\.0"):
        load_config(None, ["pipeline.beam_args=[runner=DirectRunner]"])


def _runs_with_prism(args: list[str], monkeypatch) -> bool:
    """Whether Beam tries its Prism runner on the CSV ExampleGen's pipeline with these args (the
    attempt is stopped where it would fetch Prism's binary)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability import prism_runner

    from components.csv_example_gen import _examples
    from ingestion.csv_options import CsvOptions

    tried = []

    def no_download(self, *args, **kwargs):
        tried.append(True)
        raise RuntimeError("no Prism here")

    monkeypatch.setattr(prism_runner.PrismRunner, "run_pipeline", no_download)
    with beam.Pipeline(options=PipelineOptions(args)) as pipeline:
        [tagged] = _examples(pipeline, [("all", str(REPO / "data" / "penguins.csv"), ["train", "eval"], [2, 3])],
                             CsvOptions())
        tagged["train"] | beam.combiners.Count.Globally()
    return bool(tried)


def test_beam_runs_in_process_unless_a_runner_is_named(monkeypatch):
    from apache_beam.options.pipeline_options import StandardOptions

    import components

    assert StandardOptions.DEFAULT_RUNNER == components.IN_PROCESS_RUNNER
    assert not _runs_with_prism([], monkeypatch)
    # Beam's own default would try Prism on the ExampleGen's pipeline (a download, a Go process),
    # and so does a DirectRunner named in the Beam args.
    assert _runs_with_prism(["--runner=DirectRunner"], monkeypatch)
    monkeypatch.setattr(StandardOptions, "DEFAULT_RUNNER", "DirectRunner")
    assert _runs_with_prism([], monkeypatch)
