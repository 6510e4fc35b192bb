"""TF Serving's command line (model_servers/main.cc, server.h/.cc at r2.19), for `loopline serve`
and the `tensorflow_model_server` command: the same flag names, defaults and meanings, parsed by
TensorFlow's rules (command_line_flags.cc): `--name=value`; a boolean also as `--name`, and its
value true/false (any case) or 1/0; the last repeat wins; an unknown argument is reported and the
server carries on; a value that does not parse stops it.

Each flag is implemented, accepted with one warning line saying what is not done (only when its
value asks for something other than TF Serving's default), or refused at start-up with one line.
What the flags cannot say comes from loopline.yaml's `serving:` keys when `--config`/`--set` are
given (serving.allowed_base_paths, serving.cpus, ...)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from importlib import metadata

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from serving.config import BatchingConfig, ServingConfig

INT32_MAX = 2**31 - 1  # TF Serving's gRPC message size limit (SetMaxMessageSize)
ALL_INTERFACES = "0.0.0.0"  # where TF Serving binds gRPC ("0.0.0.0:<port>") and REST
_CPUS = os.cpu_count() or 1

IMPLEMENTED, WARNED, REFUSED = "implemented", "accepted with a warning", "refused"


@dataclass(frozen=True)
class Flag:
    name: str
    kind: str  # int32, int64, float, bool, string
    default: object
    handling: str = IMPLEMENTED
    note: str = ""  # for a warned or refused flag: what loopline does instead


def _warned(name, kind, default, note):
    return Flag(name, kind, default, WARNED, note)


def _refused(name, kind, default, note):
    return Flag(name, kind, default, REFUSED, note)


FLAGS = [  # main.cc's order
    Flag("port", "int32", 8500),
    Flag("grpc_socket_path", "string", ""),
    Flag("rest_api_port", "int32", 0),
    Flag("rest_api_num_threads", "int32", 4 * _CPUS),
    Flag("rest_api_timeout_in_ms", "int32", 30000),
    Flag("rest_api_enable_cors_support", "bool", False),
    Flag("enable_batching", "bool", False),
    Flag("allow_version_labels_for_unavailable_models", "bool", False),
    Flag("batching_parameters_file", "string", ""),
    _warned("enable_per_model_batching_parameters", "bool", False,
            "batching_params.pbtxt in a SavedModel is not read; the --batching_parameters_file values apply to every model"),
    Flag("model_config_file", "string", ""),
    Flag("model_config_file_poll_wait_seconds", "int32", 0),
    Flag("model_name", "string", "default"),
    Flag("model_base_path", "string", ""),
    _warned("num_load_threads", "int32", 0, "versions load one at a time"),
    _warned("num_unload_threads", "int32", 0, "each old version is unloaded by a thread of its own"),
    _warned("max_num_load_retries", "int32", 5,
            "a version that failed to load is tried again once its files change, not a fixed number of times"),
    _warned("load_retry_interval_micros", "int64", 60_000_000,
            "a version that failed to load is tried again once its files change (seen at the next poll)"),
    Flag("file_system_poll_wait_seconds", "int32", 1),
    _warned("flush_filesystem_caches", "bool", True, "there are no file system caches to flush"),
    Flag("tensorflow_session_parallelism", "int64", 0),
    _warned("tensorflow_session_config_file", "string", "",
            "the ConfigProto file is not read; use the --tensorflow_*_parallelism flags"),
    Flag("tensorflow_intra_op_parallelism", "int64", 0),
    Flag("tensorflow_inter_op_parallelism", "int64", 0),
    _refused("use_alts_credentials", "bool", False,
             "ALTS is not available here, and serving plaintext instead would be a hole; "
             "loopline's own gRPC TLS is serving.tls_cert/serving.tls_key (with --config)"),
    _refused("ssl_config_file", "string", "",
             "SSLConfig files are not read, and serving plaintext instead would be a hole; "
             "loopline's own gRPC TLS is serving.tls_cert/serving.tls_key (with --config)"),
    _refused("platform_config_file", "string", "",
             "only the tensorflow platform is served, configured by these flags"),
    _warned("per_process_gpu_memory_fraction", "float", 0.0, "TensorFlow's GPU memory settings are left as they are"),
    Flag("saved_model_tags", "string", "serve"),
    Flag("grpc_channel_arguments", "string", ""),
    Flag("grpc_max_threads", "int32", 4 * _CPUS),
    Flag("enable_model_warmup", "bool", True),
    Flag("num_request_iterations_for_warmup", "int32", 0),
    Flag("version", "bool", False),
    Flag("monitoring_config_file", "string", ""),
    _warned("remove_unused_fields_from_bundle_metagraph", "bool", True,
            "only the SignatureDefs are kept beside the loaded graph, either way"),
    Flag("prefer_tflite_model", "bool", False),
    Flag("num_tflite_pools", "int32", _CPUS),
    _warned("num_tflite_interpreters_per_pool", "int32", 1,
            "a TFLite model's interpreters take one request each, with no batch scheduler per pool "
            "(--enable_batching batches requests before they reach the pool)"),
    Flag("enable_signature_method_name_check", "bool", False),
    _warned("xla_cpu_compilation_enabled", "bool", False, "XLA JIT is left as TensorFlow sets it"),
    _warned("xla_gpu_compilation_enabled", "bool", False, "XLA JIT is left as TensorFlow sets it"),
    _warned("enable_profiler", "bool", True, "no profiler service runs on the gRPC port (TF Serving's default runs one)"),
    _warned("thread_pool_factory_config_file", "string", "", "requests run on the server's own thread pools"),
    _warned("mixed_precision", "string", "", "models run in the precision they were saved in"),
    _warned("skip_initialize_tpu", "bool", False, "there is no TPU support"),
    Flag("enable_grpc_healthcheck_service", "bool", False),
    Flag("enable_serialization_as_tensor_content", "bool", False),
]
BY_NAME = {f.name: f for f in FLAGS}
_WARN_WHEN = {"enable_profiler": lambda v: v}  # warned when asked for, not at TF Serving's default


class FlagError(Exception):
    """The server does not start: `message` is the line to print, `exit_code` TF Serving's (255) or
    loopline's (2, for a refused flag)."""

    def __init__(self, message: str, exit_code: int = 255):
        super().__init__(message)
        self.message, self.exit_code = message, exit_code


def start_error(message: str) -> FlagError:
    """Server::BuildAndStart's refusals, printed as main.cc prints them."""
    return FlagError(f"Failed to start server. Error: INVALID_ARGUMENT: {message}")


# -- parsing (tsl/util/command_line_flags.cc) ------------------------------------------------------
_INT = re.compile(r"\s*[+-]?[0-9]+")  # sscanf("%d%c") == 1
_FLOAT = re.compile(r"\s*[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?|nan)", re.I)
_RANGES = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}


def _value(flag: Flag, text: str):
    """The flag's value, or None when `text` does not parse as its type."""
    if flag.kind == "string":
        return text
    if flag.kind == "bool":
        lowered = text.lower()
        return True if lowered in ("true", "1") else False if lowered in ("false", "0") else None
    if flag.kind == "float":
        return float(text) if _FLOAT.fullmatch(text) else None
    if not _INT.fullmatch(text):
        return None
    number = int(text)
    low, high = _RANGES[flag.kind]
    return number if low <= number <= high else None


def _match(arg: str) -> tuple[Flag, str | None] | None:
    """The flag `arg` sets and its value text (None: a bare boolean), or None when no flag takes it."""
    if not arg.startswith("--"):
        return None
    body = arg[2:]
    name, eq, text = body.partition("=")
    flag = BY_NAME.get(name)
    if flag is None:
        return None
    if not eq:
        return (flag, None) if flag.kind == "bool" else None  # `--port` alone is not the port flag
    return flag, text


@dataclass
class Parsed:
    values: dict = field(default_factory=lambda: {f.name: f.default for f in FLAGS})
    given: list[str] = field(default_factory=list)  # flags set on the command line, in order
    unknown: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # values that did not parse

    @property
    def help(self) -> bool:
        return bool(self.unknown) and self.unknown[0] == "--help"


def parse(argv: list[str]) -> Parsed:
    parsed = Parsed()
    for i, arg in enumerate(argv):
        if arg == "--":
            parsed.unknown.extend(argv[i:])
            break
        found = _match(arg)
        if found is None:
            parsed.unknown.append(arg)
            continue
        flag, text = found
        value = True if text is None else _value(flag, text)
        if value is None:
            parsed.errors.append(f"Couldn't interpret value {text} for flag {flag.name}.")
            continue
        parsed.values[flag.name] = value
        parsed.given.append(flag.name)
    return parsed


def looks_like_tf_serving(argv: list[str]) -> bool:
    """Whether an argument list sets at least one TF Serving flag (then it is that command line)."""
    return any(_match(arg) is not None for arg in argv)


def usage(program: str = "tensorflow_model_server") -> str:
    """Flags::Usage's layout: every flag with its default and type, and how loopline handles it."""
    lines = [f"usage: {program}", "Flags:"]
    for f in FLAGS:
        default = f'"{f.default}"' if f.kind == "string" else str(f.default).lower() if f.kind == "bool" else f.default
        note = "" if f.handling == IMPLEMENTED else f"{f.handling}: {f.note}"
        lines.append(f"\t{'--' + f.name + '=' + str(default):<33}\t{f.kind}\t{note}")
    return "\n".join(lines)


def version_text() -> str:
    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "unknown"

    return (f"TensorFlow ModelServer: loopline {version('loopline')} (TF Serving {version('tensorflow-serving-api')} APIs)\n"
            f"TensorFlow Library: {version('tensorflow')}")


# -- from the flags to the server --------------------------------------------------------------------
def warnings_and_refusals(parsed: Parsed) -> list[str]:
    """One line per warned flag that asks for what is not done (and TF Serving's own line for a REST
    port equal to the gRPC port); raises FlagError for a refused flag."""
    v = parsed.values
    lines = []
    if v["rest_api_port"] != 0 and v["rest_api_port"] == v["port"]:
        lines.append("server_options.http_port cannot be same as grpc_port. Please use a different port for "
                     "HTTP/REST API. Skipped exporting HTTP/REST API.")
    for name in dict.fromkeys(parsed.given):
        flag, value = BY_NAME[name], v[name]
        asks = _WARN_WHEN[name](value) if name in _WARN_WHEN else value != flag.default
        if not asks:
            continue
        if flag.handling == REFUSED:
            raise FlagError(f"loopline serve: --{name} is refused: {flag.note}", exit_code=2)
        if flag.handling == WARNED:
            lines.append(f"loopline serve: --{name}={value} accepted but not applied: {flag.note}")
    return lines


def build_checks(v: dict) -> None:
    """Server::BuildAndStart's checks of the options, with its texts."""
    if v["port"] == 0 and not v["grpc_socket_path"]:
        raise start_error("At least one of server_options.grpc_port or server_options.grpc_socket_path must be set.")
    if not v["model_base_path"] and not v["model_config_file"]:
        raise start_error("Both server_options.model_base_path and server_options.model_config_file are empty!")
    if v["batching_parameters_file"] and not v["enable_batching"]:
        raise start_error("server_options.batching_parameters_file is set without setting "
                          "server_options.enable_batching to true.")
    if all(v[f"tensorflow_{k}_parallelism"] > 0 for k in ("intra_op", "inter_op", "session")):
        raise start_error("Either configure server_options.tensorflow_session_parallelism or "
                          "(server_options.tensorflow_intra_op_parallelism, "
                          "server_options.tensorflow_inter_op_parallelism) separately. You cannot configure all.")


def single_model_config(name: str, base_path: str) -> model_server_config_pb2.ModelServerConfig:
    """BuildSingleModelConfig: --model_name and --model_base_path as a one-model config."""
    config = model_server_config_pb2.ModelServerConfig()
    config.model_config_list.config.add(name=name, base_path=base_path, model_platform="tensorflow")
    return config


def channel_arguments(text: str) -> list[tuple[str, int | str]]:
    """parseGrpcChannelArgs: `key=value,...`; a value that parses as an int32 goes as an int."""
    out = []
    for item in text.split(",") if text else []:
        key, _, value = item.partition("=")
        number = _value(BY_NAME["port"], value) if value.strip() else None
        out.append((key, number if number is not None else value))
    return out


def batching(v: dict) -> BatchingConfig:
    """--enable_batching and --batching_parameters_file; unset values take BasicBatchScheduler's
    defaults (1000 rows, no timeout, 10 queued batches, one thread per CPU)."""
    from serving.config_writer import BatchingParameters  # the API wheel lacks session_bundle_config.proto

    params = BatchingParameters()
    if v["batching_parameters_file"]:
        params = _read_text(v["batching_parameters_file"], BatchingParameters, "BatchingParameters")

    def pick(name: str, default: int) -> int:
        return getattr(params, name).value if params.HasField(name) else default

    return BatchingConfig(enabled=v["enable_batching"], max_batch_size=pick("max_batch_size", 1000),
                          batch_timeout_micros=pick("batch_timeout_micros", 0),
                          max_enqueued_batches=pick("max_enqueued_batches", 10),
                          num_batch_threads=pick("num_batch_threads", _CPUS))


def prometheus_path(v: dict) -> str | None:
    """--monitoring_config_file: the Prometheus page's path when it is enabled (REST only)."""
    if not v["monitoring_config_file"]:
        return None
    from serving.config_writer import PROMETHEUS_PATH, MonitoringConfig

    prometheus = _read_text(v["monitoring_config_file"], MonitoringConfig, "MonitoringConfig").prometheus_config
    return (prometheus.path or PROMETHEUS_PATH) if prometheus.enable else None


def _read_text(path: str, message_class, type_name: str):
    import tensorflow as tf

    try:
        with tf.io.gfile.GFile(path) as f:
            return text_format.Parse(f.read(), message_class(), allow_unknown_field=True)
    except (text_format.ParseError, tf.errors.OpError) as exc:
        raise start_error(f"Error parsing text-format tensorflow.serving.{type_name}: {path}: {exc}") from None


def serving_config(v: dict, base: ServingConfig) -> ServingConfig:
    """loopline's serving keys as the flags set them; keys no flag covers come from `base` (the
    --config file or --set). Two follow TF Serving unless `base` sets them: serving.host binds all
    interfaces, serving.max_request_bytes is INT32_MAX."""
    intra, inter, session = (v[f"tensorflow_{k}_parallelism"] for k in ("intra_op", "inter_op", "session"))
    if intra <= 0 and inter <= 0:
        intra = inter = max(session, 0)
    settings = base.model_dump()
    settings.update(
        grpc_port=v["port"], rest_port=v["rest_api_port"], warmup=v["enable_model_warmup"],
        signature_method_name_check=v["enable_signature_method_name_check"], grpc_workers=max(v["grpc_max_threads"], 1),
        intra_op_threads=max(intra, 0), inter_op_threads=max(inter, 0), batching=batching(v).model_dump(),
        prefer_tflite=v["prefer_tflite_model"], tflite_interpreters=max(v["num_tflite_pools"], 1),
    )
    for key, tf_serving_value in (("host", ALL_INTERFACES), ("max_request_bytes", INT32_MAX)):
        if key not in base.model_fields_set:
            settings[key] = tf_serving_value
    try:
        return ServingConfig(**settings)
    except ValueError as exc:
        raise start_error(str(exc).replace("\n", " ")) from None


def server_options(v: dict):
    """The ServerOptions the flags ask for (serving.options)."""
    from serving.options import ServerOptions

    single = None if v["model_config_file"] else single_model_config(v["model_name"], v["model_base_path"])
    rest_on = v["rest_api_port"] != 0 and v["rest_api_port"] != v["port"]
    return ServerOptions(
        models_config=v["model_config_file"] or None, model_config=single,
        config_poll_seconds=v["model_config_file_poll_wait_seconds"],
        version_poll_seconds=v["file_system_poll_wait_seconds"],
        tf_serving_rules=True, allow_unavailable_labels=v["allow_version_labels_for_unavailable_models"],
        saved_model_tags=tuple(v["saved_model_tags"].split(",")),
        warmup_iterations=max(v["num_request_iterations_for_warmup"], 1),
        tensor_content=v["enable_serialization_as_tensor_content"],
        grpc_tcp=v["port"] != 0, grpc_socket_path=v["grpc_socket_path"],
        grpc_channel_arguments=channel_arguments(v["grpc_channel_arguments"]), grpc_max_message_bytes=INT32_MAX,
        grpc_health_check=v["enable_grpc_healthcheck_service"],
        rest_enabled=rest_on, rest_threads=max(v["rest_api_num_threads"], 1), rest_timeout_ms=max(v["rest_api_timeout_in_ms"], 0),
        rest_cors=v["rest_api_enable_cors_support"], prometheus_path=prometheus_path(v),
    )


def banner(program: str, host: str) -> str:
    """What the first line on stdout says about the binding."""
    if host == ALL_INTERFACES:
        return f"as {program} on all interfaces ({ALL_INTERFACES}, as TF Serving binds)"
    return f"as {program} on {host} (serving.host)"


def serve_with_flags(argv: list[str], base: ServingConfig, program: str = "tensorflow_model_server") -> int:
    """main.cc: parse, --help and --version, report the first unknown argument, check, serve until
    stopped. Error lines go to stderr; the first line on stdout says where it serves."""
    import sys

    parsed = parse(argv)
    if parsed.help or parsed.errors:
        print("\n".join(parsed.errors) or usage(program), file=sys.stderr if parsed.errors else sys.stdout)
        if parsed.errors:
            print("(tensorflow_model_server --help lists TF Serving's flags)", file=sys.stderr)
        return 255  # main.cc returns -1 when the flags do not parse, --help included
    v = parsed.values
    if v["version"]:
        print(version_text())
        return 0
    if parsed.unknown:
        print(f"unknown argument: {parsed.unknown[0]}", file=sys.stderr)
    try:
        for line in warnings_and_refusals(parsed):
            print(line, file=sys.stderr)
        build_checks(v)
        config, options = serving_config(v, base), server_options(v)
    except FlagError as exc:
        print(exc.message, file=sys.stderr)
        return exc.exit_code
    from serving.errors import ServingError
    from serving.server import serve_forever

    try:
        return serve_forever(None, config, options=options, banner=banner(program, config.host))
    except ServingError as exc:
        print(f"Failed to start server. Error: {exc.code.name}: {exc.message}", file=sys.stderr)
    except OSError as exc:
        print(f"Failed to start server. Error: {exc}", file=sys.stderr)
    return 255
