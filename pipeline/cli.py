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


def _serving_root(config) -> str:
    return os.path.join(config.pipeline.root, "serving")


def cmd_serve(args) -> int:
    from serving.server import serve_forever

    config = _config(args)
    serving = config.serving
    for key in ("host", "grpc_port", "rest_port"):
        if getattr(args, key) is not None:
            setattr(serving, key, getattr(args, key))
    return serve_forever(args.serving_root or _serving_root(config), serving)


def cmd_predict(args) -> int:
    from serving.client import GrpcClient, RestClient, predict_rows, read_rows, wait_until_serving

    config = _config(args)
    serving = config.serving
    host = args.host or serving.host
    model = args.model or serving.model_name
    if args.rest:
        client = RestClient(f"http://{host}:{args.port or serving.rest_port}", timeout=args.timeout)
    else:
        ca = open(args.tls_ca, "rb").read() if args.tls_ca else None
        client = GrpcClient(f"{host}:{args.port or serving.grpc_port}", timeout=args.timeout, root_certificate=ca)
    try:
        rows = read_rows(args.input)
        if args.wait:
            wait_until_serving(client, model, args.wait)
        print("\n".join(predict_rows(rows, model, client, args.signature)))
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loopline", description="Data to a served model on the TensorFlow stack.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the whole pipeline locally (LocalDagRunner)")
    _common(run)
    run.set_defaults(func=cmd_run)
    serve = sub.add_parser("serve", help="serve <pipeline.root>/serving over TF Serving's gRPC and REST APIs")
    _common(serve)
    serve.add_argument("--grpc-port", type=int, default=None, help="default: serving.grpc_port (0: any free port)")
    serve.add_argument("--rest-port", type=int, default=None, help="default: serving.rest_port (0: any free port)")
    serve.add_argument("--host", default=None, help="address to bind (default: serving.host, 127.0.0.1)")
    serve.add_argument("--serving-root", default=None, help="folder with models.config (default: <pipeline.root>/serving)")
    serve.set_defaults(func=cmd_serve)
    predict = sub.add_parser("predict", help="send rows (JSON or CSV) to a running server and print predictions")
    _common(predict)
    predict.add_argument("input", help="rows: a .csv with a header, a JSON list of objects, or JSON lines")
    predict.add_argument("--model", default=None, help="default: serving.model_name")
    predict.add_argument("--host", default=None, help="default: serving.host")
    predict.add_argument("--port", type=int, default=None, help="default: serving.grpc_port (or rest_port with --rest)")
    predict.add_argument("--rest", action="store_true", help="use the REST API instead of gRPC")
    predict.add_argument("--signature", default="predict_raw", help="signature taking one tensor per feature")
    predict.add_argument("--tls-ca", default=None, help="PEM root certificate for a TLS gRPC server")
    predict.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    predict.add_argument("--wait", type=float, default=0, help="wait up to this many seconds for the model to be served")
    predict.set_defaults(func=cmd_predict)
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_libraries()
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"loopline: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
