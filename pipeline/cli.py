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
    models_config = model_config_path(os.path.join(config.pipeline.root, "serving"))
    try:
        follow_in_serving(client, promotion, models_config, config.serving.model_name, label)
    except (PromotionError, ModelConfigError) as exc:
        print(f"loopline: error: {exc}", file=sys.stderr)
        return 1
    print(promotion.lines()[-1])
    return 0


def cmd_models(args) -> int:
    from pipeline.tracking_setup import registered_model_name
    from tracking.promotion import format_table, list_versions

    config = _config(args)
    model = args.model or registered_model_name(config)
    try:
        rows = list_versions(_registry(config), model)
    except Exception as exc:
        if type(exc).__name__ != "MlflowException":
            raise
        print(f"loopline: error: registered model {model!r}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"{model} ({len(rows)} versions)")
    print(format_table(rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loopline", description="Data to a served model on the TensorFlow stack.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the whole pipeline locally (LocalDagRunner)")
    _common(run)
    run.set_defaults(func=cmd_run)
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
