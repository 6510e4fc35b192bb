"""The `loopline` command line."""
from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import re
import sys

from ingestion.op_errors import op_message
from pipeline.config import ConfigError, load_config
from pipeline.deferred_imports import defer_unused_imports
from pipeline.library_env import set_library_env
from pipeline.run_lock import RunLockedError
from pipeline.run_log import CommandLog, import_tensorflow_quietly, new_run_id
from serving.signature_names import PREDICT_RAW

DEFAULT_CONFIG = "loopline.yaml"
EXIT_LOCKED = 75  # EX_TEMPFAIL: another run holds the root; try again later


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help=f"YAML config (default: ./{DEFAULT_CONFIG} if present)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set trainer.epochs=5 (repeatable)")


def _logged(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also print the whole log (<pipeline.root>/logs/...) to the terminal")


def _config(args):
    path = args.config
    if path is None and os.path.isfile(DEFAULT_CONFIG):
        path = DEFAULT_CONFIG
    return load_config(path, args.overrides)


@contextlib.contextmanager
def _kept_to_the_end(whole_process: bool):
    """When the run is the process's command, what it imports (TF, TFX, Beam: millions of objects)
    lives until the process ends. The cyclic collector is off while they are made (its full scans
    would walk them again and again: about 2 CPU s of the imports) and they are set aside from it
    after (gc.freeze), so its scans during the run, in TFLite's converter and at exit look at the
    run's own objects only. Called from Python (main(argv)), the caller's collector is left as it is."""
    if not whole_process:
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def cmd_run(args) -> int:
    config = _config(args)  # before TensorFlow loads: a bad config costs one line and no wait
    run_id = new_run_id()
    console = args.log.open(config, run_id)
    with _kept_to_the_end(args.whole_process):
        from pipeline.component_lines import component_lines
        from pipeline.local_runner import run_local
        from pipeline.tracking_setup import import_tracking

        if args.whole_process:
            import_tracking(config)
    with component_lines(config, run_id, console):
        summary = run_local(config, run_id=run_id)
    if args.whole_process:
        gc.freeze()  # and what the run loaded since (MLflow, the Beam runner): the exit need not scan it either
    print("\n".join(["", "loopline run finished", *summary.lines(), f"log        {args.log.path}"]))
    return 0


def cmd_compile(args) -> int:
    import_tensorflow_quietly()  # a command without a log
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
    config = _config(args)
    args.log.open(config)
    from pipeline.data_report import data_report

    path = data_report(config, args.out)
    print(f"data report: {path}")
    return 0


def cmd_data_accept(args) -> int:
    config = _config(args)
    args.log.open(config)
    from pipeline.data_accept import accept_data

    print("\n".join(accept_data(config)))
    return 0


def cmd_train(args) -> int:
    """The trainer alone, for fast iteration and for the TFJob: on TFRecord splits, or data.path."""
    config = _config(args)
    args.log.open(config)
    from pipeline.train_command import run_train

    outcome = run_train(config, args.work_dir, args.train, args.eval)
    where = f"; model in {outcome.model_dir}" if outcome.model_dir else " (not the chief: no export)"
    print(f"loopline train: {outcome.steps} steps; checkpoints and TensorBoard under {outcome.work_dir}{where}")
    print(" ".join(f"{k}={v:.4g}" for k, v in outcome.metrics.items()))
    return 0


def _serving_root(config) -> str:
    return os.path.join(config.pipeline.root, "serving")


def _pin_to_cpus(cpus: list[int]) -> None:
    """serving.cpus, set before TensorFlow and gRPC start their threads: they inherit it."""
    if not hasattr(os, "sched_setaffinity"):
        raise ConfigError("serving.cpus: pinning to CPUs needs Linux")
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        raise ConfigError(f"serving.cpus={cpus}: not CPUs this process may use "
                          f"({sorted(os.sched_getaffinity(0))})") from None


def cmd_tensorboard(args) -> int:
    """TensorBoard on --logdir, or on the newest Trainer run under pipeline.root."""
    from pipeline.tensorboard import newest_logdir, serve

    logdir = args.logdir or newest_logdir(_config(args).pipeline.root)
    serve(logdir, args.host, args.port)
    return 0


def _prepare_serving_process(serving, log_opens: bool = True) -> None:
    """Before TensorFlow loads; `log_opens=False`: the command has no log (TF Serving's flags)."""
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1" if serving.onednn else "0")
    if serving.cpus:
        _pin_to_cpus(serving.cpus)
    if not log_opens:
        import_tensorflow_quietly()


def _supervised(serving, whole_process: bool) -> int | None:
    """With serving.supervise, when `loopline serve` is the process's own command: runs the same
    command line again as the server, in a child process restarted when it crashes
    (serving.supervisor), and returns the exit code. None: this process serves (supervision off,
    the child itself, or a call from Python)."""
    from serving import supervisor

    if not (serving.supervise and whole_process) or supervisor.state_folder():
        return None
    if serving.cpus:
        _pin_to_cpus(serving.cpus)  # the supervisor too stays off the cores its clients use
    policy = supervisor.RestartPolicy(serving.restart_delay_seconds, serving.max_rapid_restarts)
    return supervisor.supervise([sys.executable, *sys.orig_argv[1:]], policy)


def cmd_serve(args) -> int:
    if args.tf_serving_flags:
        return _serve_with_tf_serving_flags(args)
    config = _config(args)
    serving = config.serving
    supervised = _supervised(serving, args.whole_process)
    if supervised is not None:
        return supervised
    _prepare_serving_process(serving)
    for key in ("host", "grpc_port", "rest_port"):
        if getattr(args, key) is not None:
            setattr(serving, key, getattr(args, key))
    serving_root = args.serving_root or _serving_root(config)
    args.log.open(config)
    import tensorflow as tf  # after the log: its C++ start-up lines go there

    if not tf.io.gfile.isdir(serving_root):  # a bucket's folder too (gs://)
        raise FileNotFoundError(f"serving root {serving_root} does not exist; run the pipeline (loopline run) first")
    from serving.request_log_config import request_log_dir, write_request_log_file
    from serving.server import serve_forever

    # serving.request_log as given here, beside models.config; the server polls it for later changes
    write_request_log_file(serving_root, serving.request_log, request_log_dir(config.pipeline.root))
    return serve_forever(serving_root, serving)


def _serve_with_tf_serving_flags(args) -> int:
    """`loopline serve --port=8500 --model_name=m --model_base_path=/models/m ...`: TF Serving's
    command line (serving.tf_serving_flags). loopline.yaml is read only when --config or --set is
    given, for the keys no TF Serving flag covers."""
    own = [f"--{key.replace('_', '-')}" for key in ("grpc_port", "rest_port", "host", "serving_root")
           if getattr(args, key) is not None]
    if own:
        raise ConfigError(f"{', '.join(own)}: loopline's own flags do not mix with TF Serving's; use --port, "
                          "--rest_api_port, --model_config_file (or --set serving.host=...)")
    from serving.config import ServingConfig
    from serving.tf_serving_flags import serve_with_flags

    serving = load_config(args.config, args.overrides).serving if args.config or args.overrides else ServingConfig()
    supervised = _supervised(serving, args.whole_process)
    if supervised is not None:
        return supervised
    _prepare_serving_process(serving, log_opens=False)
    return serve_with_flags(args.tf_serving_flags, serving, "loopline serve")


def tf_serving_main(argv: list[str] | None = None) -> int:
    """The `tensorflow_model_server` command: every argument is one of TF Serving's flags, so the
    tensorflow/serving image's entrypoint line and manifests written for it run unchanged."""
    if argv is None:
        defer_unused_imports()
    set_library_env()
    _quiet_libraries()
    from serving.config import ServingConfig
    from serving.tf_serving_flags import serve_with_flags

    serving = ServingConfig()
    supervised = _supervised(serving, whole_process=argv is None)
    if supervised is not None:
        return supervised
    _prepare_serving_process(serving, log_opens=False)
    return serve_with_flags(sys.argv[1:] if argv is None else argv, serving)


def cmd_predict(args) -> int:
    config = _config(args)
    args.log.open(config)
    from serving.client import (IMAGE_SUFFIXES, GrpcClient, RestClient, predict_images, predict_rows, read_rows,
                                wait_until_serving)

    serving = config.serving
    host = args.host or serving.host
    model = args.model or serving.model_name
    if args.rest:
        client = RestClient(f"http://{host}:{args.port or serving.rest_port}", timeout=args.timeout)
    else:
        ca = open(args.tls_ca, "rb").read() if args.tls_ca else None
        client = GrpcClient(f"{host}:{args.port or serving.grpc_port}", timeout=args.timeout, root_certificate=ca)
    try:
        images = all(path.lower().endswith(IMAGE_SUFFIXES) for path in args.input)
        if not images and len(args.input) != 1:
            raise ValueError("give one rows file (.csv or JSON), or image files")
        rows = None if images else read_rows(args.input[0], config.data.csv_options())
        if args.wait:
            wait_until_serving(client, model, args.wait)
        print("\n".join(predict_images(args.input, model, client) if images
                        else predict_rows(rows, model, client, args.signature)))
    except ValueError as exc:
        print(f"loopline predict: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # grpc.RpcError / HTTP errors: say what the server said
        detail = exc.details() if hasattr(exc, "details") else str(exc)
        code = exc.code().name if hasattr(exc, "code") and callable(exc.code) else "ERROR"
        print(f"loopline predict: {code}: {detail}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


def cmd_monitor(args) -> int:
    """Served requests of a window against the served version's training data (docs/monitoring.md)."""
    import time

    config = _config(args)
    from pipeline.monitor import monitor, parse_window, result_lines
    from pipeline.monitor_labels import read_labels

    try:  # a bad argument is exit code 2, not the 1 of a crossed threshold
        window = parse_window(args.since, args.until, time.time())
        labels = read_labels(args.labels) if args.labels else None
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    result = monitor(config, window, labels)
    print("\n".join(result_lines(result, config.serving.model_name)))
    return 0 if result.passed else 1


def cmd_infer(args) -> int:
    """Batch inference through the server's signature code, into a Parquet or CSV file."""
    config = _config(args)
    from pipeline.infer import infer

    result = infer(config, args.data, args.output, args.version, args.format, args.batch_size, not args.no_progress)
    print("\n".join([
        f"infer      {result.examples} examples with {config.serving.model_name} version {result.version} "
        f"in {result.seconds:.1f}s ({result.examples_per_second:,.0f} examples/s)",
        f"output     {result.output}",
        f"mlflow     {'run ' + result.run_id if result.run_id else 'not recorded (mlflow.enabled is false)'}",
    ]))
    return 0


def _version_arg(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.isdigit():
        raise ConfigError(f"version {text!r}: expected a serving version number")
    return int(text)


def cmd_card(args) -> int:
    """A pushed version's model card (HTML, Markdown, PNGs), written again from its records."""
    config = _config(args)
    import_tensorflow_quietly()  # a command without a log
    from pipeline.lineage import LineageError, choose_version, write_version_card

    try:
        version = choose_version(config, args.model, _version_arg(args.version))
        page = write_version_card(config, args.model, version, args.out)
    except LineageError as exc:
        print(f"loopline: error: {exc}", file=sys.stderr)
        return 1
    print(f"model card of {args.model} version {version}: {page}")
    return 0


def cmd_lineage(args) -> int:
    """Where a pushed version came from, from ML Metadata and MLflow."""
    import json

    config = _config(args)
    import_tensorflow_quietly()  # a command without a log
    from pipeline.lineage import LineageError, choose_version, version_lineage
    from tracking.lineage import lineage_lines

    try:
        version = choose_version(config, args.model, _version_arg(args.version))
        lineage, _ = version_lineage(config, args.model, version)
    except LineageError as exc:
        print(f"loopline: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(lineage, indent=2, default=str) if args.json else "\n".join(lineage_lines(lineage)))
    return 0


def _registry(config):
    from pipeline.tracking_setup import tracking_target
    from tracking.target import make_client

    target = tracking_target(config)
    if target is None:
        raise ConfigError("mlflow.enabled is false: there is no model registry to use")
    return make_client(target)


def cmd_promote(args) -> int:
    from pipeline.tracking_setup import registered_model_name
    from serving.model_config import ModelConfigError, model_config_path
    from tracking.promotion import PromotionError, follow_in_serving, move_alias

    config = _config(args)
    model = args.model or registered_model_name(config)
    if not args.rollback and args.version is None:
        raise ConfigError("promote: give --version N, or --rollback")
    client = _registry(config)
    try:
        promotion = move_alias(client, model, args.alias, args.version, rollback=args.rollback)
    except PromotionError as exc:
        print(f"loopline: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(promotion.lines()))
    label = config.mlflow.alias_labels.get(args.alias)
    if label is None:
        print(f"(alias '{args.alias}' has no entry in mlflow.alias_labels; TF Serving labels unchanged)")
        return 0
    models_config = model_config_path(_serving_root(config))
    try:
        follow_in_serving(client, promotion, models_config, config.serving.model_name, label)
    except (PromotionError, ModelConfigError) as exc:
        print(f"loopline: error: {exc}", file=sys.stderr)
        return 1
    print("\n".join(promotion.lines()[1:]))
    return 0


def cmd_models(args) -> int:
    from pipeline.tracking_setup import registered_model_name
    from tracking.promotion import format_table, list_versions

    config = _config(args)
    model = args.model or registered_model_name(config)
    try:
        rows = list_versions(_registry(config), model)
    except Exception as exc:
        from mlflow.exceptions import MlflowException

        if not isinstance(exc, MlflowException):
            raise
        print(f"loopline: error: registered model {model!r}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"{model} ({len(rows)} versions)")
    print(format_table(rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loopline", description="Data to a served model on the TensorFlow stack.")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_commands in (_pipeline_commands, _data_commands, _training_commands, _serving_commands,
                         _registry_commands):
        add_commands(sub)
    return parser


def _pipeline_commands(sub) -> None:
    run = sub.add_parser("run", help="run the whole pipeline locally (LocalDagRunner)")
    _common(run)
    _logged(run)
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


def _data_commands(sub) -> None:
    data = sub.add_parser("data", help="data validation views").add_subparsers(dest="data_command", required=True)
    report = data.add_parser("report", help="HTML page + PNG histograms of the latest run's statistics and anomalies, "
                                            "next to its baseline's")
    _common(report)
    _logged(report)
    report.add_argument("--out", default=None, help="output folder (default: <pipeline.root>/reports/data/<run>)")
    report.set_defaults(func=cmd_data_report)
    accept = data.add_parser("accept", help="make the data of the newest run, stopped by data validation, the new baseline")
    _common(accept)
    _logged(accept)
    accept.set_defaults(func=cmd_data_accept)


def _training_commands(sub) -> None:
    train = sub.add_parser("train", help="run the trainer alone (resumes from the work folder's checkpoints)")
    _common(train)
    _logged(train)
    train.add_argument("--work-dir", default=None, help="checkpoints, TensorBoard, metrics (default: <root>/train/<name>)")
    train.add_argument("--train", default=None, help="train split TFRecord pattern (GZIP); default: data.path (CSV or image folder)")
    train.add_argument("--eval", default=None, help="eval split TFRecord pattern (GZIP)")
    train.set_defaults(func=cmd_train)
    board = sub.add_parser("tensorboard", help="open the newest Trainer run's summaries in TensorBoard")
    _common(board)
    board.add_argument("--logdir", default=None, help="default: the newest Trainer run's tensorboard/ under pipeline.root")
    board.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    board.add_argument("--port", type=int, default=6006, help="default: 6006 (0: any free port)")
    board.set_defaults(func=cmd_tensorboard)


def _serving_commands(sub) -> None:
    serve = sub.add_parser("serve", help="serve <pipeline.root>/serving over TF Serving's gRPC and REST APIs",
                           allow_abbrev=False,
                           epilog="TF Serving's own flags are taken too, with its names, defaults and meanings "
                                  "(--port=8500 --rest_api_port=8501 --model_name=m --model_base_path=/models/m, "
                                  "--model_config_file=...): `tensorflow_model_server --help` lists them. With them "
                                  "the server binds all interfaces, as TF Serving does.")
    _common(serve)
    _logged(serve)
    serve.add_argument("--grpc-port", type=int, default=None, help="default: serving.grpc_port (0: any free port)")
    serve.add_argument("--rest-port", type=int, default=None, help="default: serving.rest_port (0: any free port)")
    serve.add_argument("--host", default=None, help="address to bind (default: serving.host, 127.0.0.1)")
    serve.add_argument("--serving-root", default=None, help="folder with models.config (default: <pipeline.root>/serving)")
    serve.set_defaults(func=cmd_serve)
    predict = sub.add_parser("predict", help="send rows (JSON or CSV) to a running server and print predictions")
    _common(predict)
    _logged(predict)
    predict.add_argument("input", nargs="+", help="rows: a .csv with a header, a JSON list of objects, or JSON "
                         "lines; or image files (.png, .jpg...), sent as tf.Examples with feature 'image'")
    predict.add_argument("--model", default=None, help="default: serving.model_name")
    predict.add_argument("--host", default=None, help="default: serving.host")
    predict.add_argument("--port", type=int, default=None, help="default: serving.grpc_port (or rest_port with --rest)")
    predict.add_argument("--rest", action="store_true", help="use the REST API instead of gRPC")
    predict.add_argument("--signature", default=PREDICT_RAW, help="signature taking one tensor per feature")
    predict.add_argument("--tls-ca", default=None, help="PEM root certificate for a TLS gRPC server")
    predict.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    predict.add_argument("--wait", type=float, default=0, help="wait up to this many seconds for the model to be served")
    predict.set_defaults(func=cmd_predict)
    _monitoring_commands(sub)


def _monitoring_commands(sub) -> None:
    monitor = sub.add_parser("monitor", help="check logged requests of a time window against the served version's "
                                             "training data; exit 1 when a threshold is crossed")
    _common(monitor)
    monitor.add_argument("--since", default=None, help="window start: ISO 8601 time (2026-12-01T00:00:00Z) or a "
                                                       "duration before --until (P1D, PT6H); default P1D")
    monitor.add_argument("--until", default=None, help="window end, ISO 8601 time (default: now)")
    monitor.add_argument("--labels", default=None, help="CSV or Parquet of request_id and true labels: live metrics")
    monitor.set_defaults(func=cmd_monitor)
    infer = sub.add_parser("infer", help="predict a dataset with the champion (or --version) into a Parquet or CSV file")
    _common(infer)
    infer.add_argument("data", help="a file or glob of data.format (CSV, TFRecord, Parquet), or an image folder")
    infer.add_argument("--output", required=True, help="the predictions: .parquet or .csv (local or gs://)")
    infer.add_argument("--version", type=int, default=None, help="serving version (default: the champion)")
    infer.add_argument("--format", default=None, choices=["csv", "tfrecord", "parquet", "image_folder"],
                       help="default: data.format")
    infer.add_argument("--batch-size", type=int, default=4096, help="examples per model call (default 4096)")
    infer.add_argument("--no-progress", action="store_true", help="no progress bar")
    infer.set_defaults(func=cmd_infer)


def _registry_commands(sub) -> None:
    promote = sub.add_parser("promote", help="move an MLflow alias to a model version; TF Serving's label follows")
    _common(promote)
    promote.add_argument("--model", default=None, help="registered model (default: mlflow.registered_model or serving.model_name)")
    promote.add_argument("--version", default=None, help="the model version to promote")
    promote.add_argument("--alias", default="champion", help="the alias to move (default: champion)")
    promote.add_argument("--rollback", action="store_true", help="move the alias back to its previous holder")
    promote.set_defaults(func=cmd_promote)
    models = sub.add_parser("models", help="list registered versions, aliases and key metrics")
    _common(models)
    models.add_argument("--model", default=None, help="registered model (default: mlflow.registered_model or serving.model_name)")
    models.set_defaults(func=cmd_models)
    card = sub.add_parser("card", help="write a pushed version's model card (HTML, Markdown, PNG pictures)")
    _common(card)
    card.add_argument("model", help="the served model's name (serving.model_name)")
    card.add_argument("version", nargs="?", default=None, help="serving version (default: the newest pushed)")
    card.add_argument("--out", default=None, help="output folder (default: the version's assets.extra/model_card)")
    card.set_defaults(func=cmd_card)
    lineage = sub.add_parser("lineage", help="where a pushed version came from: data, config, commit, MLflow run")
    _common(lineage)
    lineage.add_argument("model", help="the served model's name (serving.model_name)")
    lineage.add_argument("version", help="serving version")
    lineage.add_argument("--json", action="store_true", help="print JSON instead of text")
    lineage.set_defaults(func=cmd_lineage)


class _DropMessages(logging.Filter):
    """Drops library warnings that say nothing actionable to a loopline user."""

    NOISE = ("ArtifactQuery.property_predicate is not supported",)  # TFX's resolver, every input

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(text in record.getMessage() for text in self.NOISE)


def _quiet_libraries() -> None:
    """Our progress at INFO; TFX, Beam and TensorFlow only when they warn."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # MLflow's own handler writes to whatever sys.stderr is at the time, the terminal under a
    # command log: its records go through the root handler (the log) instead.
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_DropMessages())
    for name in ("loopline", "mlflow"):
        logging.getLogger(name).setLevel(logging.INFO)
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.WARNING)
    except ImportError:
        pass


def _failure(exc: BaseException, logged: bool) -> tuple[int, str | None]:
    """The exit code and the one line for an error; no line: the traceback is shown."""
    if isinstance(exc, (ConfigError, FileNotFoundError)):
        return 2, f"loopline: error: {exc}"
    if isinstance(exc, RunLockedError):
        return EXIT_LOCKED, f"loopline: {exc}"
    if isinstance(exc, KeyboardInterrupt):
        return 130, "loopline: interrupted"
    if not isinstance(exc, Exception):  # SystemExit
        return 1, None
    return 1, _stop_message(exc, logged)


# Beam adds the step an error came from to its message: a name inside loopline's pipeline, not
# something the user can act on.
_BEAM_STEP = re.compile(r" \[while running '[^']*'\]")


def _stop_message(exc: Exception, logged: bool) -> str | None:
    """The report for errors that stop a run by design (bad data, a failed parity gate), and for
    any other error of a command with a log (the traceback is there).
    Imported here, not at the top: they load TensorFlow, which `--help` should not wait for."""
    import tensorflow as tf

    from tracking.registration import RegistryUnavailableError
    from trainer.tflite import ParityError
    from validation.anomalies import DataAnomaliesError

    if isinstance(exc, (DataAnomaliesError, RegistryUnavailableError)):
        return f"loopline: {exc}"
    if isinstance(exc, ParityError):
        return f"loopline: export refused by the TFLite parity gate: {exc}"
    if os.environ.get("LOOPLINE_TRACEBACK"):
        return None
    text = _BEAM_STEP.sub("", str(exc))
    if logged:  # the whole message is in the log, with the traceback: the terminal gets its first line
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        text = op_message(exc) if isinstance(exc, tf.errors.OpError) else lines[0] if lines else ""
    # Our own checks raise ValueError with a message naming what is wrong (a label of the wrong
    # kind, jit_compile with string features, a file that cannot be read...); OSError is e.g. a
    # port already in use.
    if isinstance(exc, (ValueError, OSError)):
        return f"loopline: error: {text}" + ("" if logged else " (LOOPLINE_TRACEBACK=1 shows where)")
    return f"loopline: error: {type(exc).__name__}: {text}" if logged else None


def _parse(argv: list[str] | None):
    """The arguments; `serve` also takes TF Serving's flags (args.tf_serving_flags), any other
    unknown argument is an error."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    args.tf_serving_flags = []
    if extra and args.command == "serve":
        from serving.tf_serving_flags import looks_like_tf_serving

        if looks_like_tf_serving(extra):
            args.tf_serving_flags = extra
    if extra and not args.tf_serving_flags:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


# Commands that only talk to a server or to the registry: TensorFlow's import (about 3 CPU s) runs
# there only if one of them reads an attribute of it. The TF Serving stubs need its protos, which
# load without it.
CLIENT_COMMANDS = ("predict", "models")


def main(argv: list[str] | None = None) -> int:
    whole_process = argv is None  # the process's own command line (the console script, python -m)
    if whole_process:
        defer_unused_imports()  # before anything imports TensorFlow
    args = _parse(argv)
    args.whole_process = whole_process
    if whole_process and args.command in CLIENT_COMMANDS:
        defer_unused_imports(("tensorflow",))
    set_library_env()
    _quiet_libraries()
    # Opened by the command once the config names pipeline.root (run, train, serve, predict, data).
    log = args.log = CommandLog("-".join(filter(None, [args.command, getattr(args, "data_command", None)])),
                                verbose=getattr(args, "verbose", False))
    try:
        code = args.func(args)
    except BaseException as exc:
        code, message = _failure(exc, logged=log.path is not None)
        log.close(None if isinstance(exc, SystemExit) else exc, message, discard=isinstance(exc, ConfigError))
        if message is None:
            raise
        print(message + (f" (log: {log.path})" if log.path else ""), file=sys.stderr)
        return code
    log.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
