"""How a server was asked to run beyond loopline.yaml's `serving:` keys: where its models come from,
how often it polls, and the TF Serving behaviours that only its command line turns on (TF
Serving's Server::Options, in Python). `loopline serve` builds them from the serving root;
`loopline serve` with TF Serving's flags (serving.tf_serving_flags) from those flags."""
from __future__ import annotations

from dataclasses import dataclass, field

from tensorflow_serving.config import model_server_config_pb2

from serving.config_writer import PROMETHEUS_PATH
from serving.signature_call import SERVE_TAGS


@dataclass
class ServerOptions:
    # Where the ModelServerConfig comes from: a text file (re-read every `config_poll_seconds`;
    # 0 or less: read once), or `model_config` given whole (--model_name/--model_base_path).
    models_config: str | None = None
    model_config: model_server_config_pb2.ModelServerConfig | None = None
    config_poll_seconds: float = 2.0
    # How often each model's base path is listed for versions: 0 lists once, below 0 never.
    version_poll_seconds: float = 2.0
    # TF Serving's rules, on when started with its flags: labels are checked before a config's
    # models load (with --allow_version_labels_for_unavailable_models: a new label, or one that
    # keeps its version, may name a version not loaded yet); only the version policy decides what
    # is loaded; a model that fails to load at start-up stops the server. Off (loopline's own
    # rules): labels are checked once the config's versions have loaded, and labelled versions
    # stay loaded whatever the policy.
    tf_serving_rules: bool = False
    allow_unavailable_labels: bool = False
    saved_model_tags: tuple[str, ...] = SERVE_TAGS
    warmup_iterations: int = 1  # --num_request_iterations_for_warmup
    tensor_content: bool = False  # --enable_serialization_as_tensor_content
    # Front ends.
    grpc_tcp: bool = True  # off: --port=0 (gRPC on the Unix socket only)
    grpc_socket_path: str = ""
    grpc_channel_arguments: list[tuple[str, int | str]] = field(default_factory=list)
    grpc_max_message_bytes: int | None = None  # None: serving.max_request_bytes
    grpc_health_check: bool = False
    rest_enabled: bool = True
    rest_threads: int | None = None  # None: serving.grpc_workers
    rest_timeout_ms: int = 0  # 0: none
    rest_cors: bool = False
    prometheus_path: str | None = PROMETHEUS_PATH  # None: no metrics page

    @classmethod
    def loopline(cls, models_config: str, poll_seconds: float) -> "ServerOptions":
        """`loopline serve`: the serving root's models.config, both polled every serving.poll_seconds."""
        return cls(models_config=models_config, config_poll_seconds=poll_seconds, version_poll_seconds=poll_seconds)
