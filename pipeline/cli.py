"""The `loopline` command line."""
from __future__ import annotations

import argparse
import logging
import os
import sys

from pipeline.config import ConfigError, load_config

DEFAULT_CONFIG = "loopline.yaml"


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help=f"YAML config (default: ./{DEFAULT_CONFIG} if present)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set trainer.epochs=5 (repeatable)")


def _config(args):
    path = args.config
    if path is None and os.path.isfile(DEFAULT_CONFIG):
        path = DEFAULT_CONFIG
    return load_config(path, args.overrides)


def cmd_run(args) -> int:
    from pipeline.local_runner import run_local

    config = _config(args)
    summary = run_local(config)
    print("\n".join(["", "loopline run finished", *summary.lines()]))
    return 0


def cmd_compile(args) -> int:
    from pipeline.kubeflow_runner import compile_kubeflow

    config = _config(args)
    compiled = compile_kubeflow(config, args.image, args.output, allow_local_paths=args.allow_local_paths)
    print("\n".join([
        f"wrote      {compiled.path}",
        f"tasks      {', '.join(compiled.tasks)}",
        f"image      {compiled.image}",
        f"root       {compiled.pipeline_root}",
        *(f"warning    {w}" for w in compiled.warnings),
    ]))
    return 0


def cmd_data_report(args) -> int:
    from pipeline.data_report import data_report

    path = data_report(_config(args), args.out)
    print(f"data report: {path}")
    return 0


def cmd_train(args) -> int:
    """The trainer alone, for fast iteration: on TFRecord splits, or straight from data.path."""
    import json

    from trainer.loop import train

    config = _config(args)
    work_dir = os.path.abspath(args.work_dir or os.path.join(config.pipeline.root, "train", config.pipeline.name))
    if args.train and args.eval:
        train_pattern, eval_pattern = args.train, args.eval
    elif args.train or args.eval:
        raise ConfigError("--train and --eval go together")
    else:
        from trainer.csv_examples import csv_to_tfrecords

        train_pattern, eval_pattern = csv_to_tfrecords(config.data.path, os.path.join(work_dir, "data"))
    result = train(config.trainer, train_pattern, eval_pattern, config.data.label, work_dir=work_dir)
    metrics = {**result.metrics, "steps": result.steps}
    with open(os.path.join(work_dir, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    print(f"loopline train: {result.steps} steps; checkpoints and TensorBoard under {work_dir}")
    print(" ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loopline", description="Data to a served model on the TensorFlow stack.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the whole pipeline locally (LocalDagRunner)")
    _common(run)
    run.set_defaults(func=cmd_run)
    compile_ = sub.add_parser("compile", help="write the pipeline spec for Kubeflow Pipelines / Vertex AI Pipelines")
    _common(compile_)
    compile_.add_argument("--target", choices=["kubeflow"], required=True, help="the orchestrator to compile for")
    compile_.add_argument("--image", required=True, help="container image every component runs in (infra/Dockerfile)")
    compile_.add_argument("--output", default="pipeline.json",
                          help="spec file: .json (Vertex PipelineJob) or .yaml (Kubeflow Pipelines); default pipeline.json")
    compile_.add_argument("--allow-local-paths", action="store_true",
                          help="accept local pipeline.root/data.path: a volume mounted at that path in every pod")
    compile_.set_defaults(func=cmd_compile)
    data = sub.add_parser("data", help="data validation views").add_subparsers(dest="data_command", required=True)
    report = data.add_parser("report", help="HTML page + PNG histograms of the latest run's statistics and anomalies")
    _common(report)
    report.add_argument("--out", default=None, help="output folder (default: <pipeline.root>/reports/data/<run>)")
    report.set_defaults(func=cmd_data_report)
    train = sub.add_parser("train", help="run the trainer alone (resumes from the work folder's checkpoints)")
    _common(train)
    train.add_argument("--work-dir", default=None, help="checkpoints, TensorBoard, metrics (default: <root>/train/<name>)")
    train.add_argument("--train", default=None, help="train split TFRecord pattern (GZIP); default: data.path CSV")
    train.add_argument("--eval", default=None, help="eval split TFRecord pattern (GZIP)")
    train.set_defaults(func=cmd_train)
    return parser


def _quiet_libraries() -> None:
    """Our progress at INFO; TFX, Beam and TensorFlow only when they warn."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("loopline").setLevel(logging.INFO)
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.WARNING)
    except ImportError:
        pass


def _stop_message(exc: Exception) -> str | None:
    """The report for errors that stop a run by design (bad data, a failed parity gate).
    Imported here, not at the top: they load TensorFlow, which `--help` should not wait for."""
    from trainer.tflite import ParityError
    from validation.anomalies import DataAnomaliesError

    if isinstance(exc, DataAnomaliesError):
        return f"loopline: {exc}"
    if isinstance(exc, ParityError):
        return f"loopline: export refused by the TFLite parity gate: {exc}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_libraries()
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"loopline: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        message = _stop_message(exc)
        if message is None:
            raise
        print(message, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
