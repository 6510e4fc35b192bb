"""The serving configuration: the `serving:` section of loopline.yaml."""
from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serving.request_log_config import RequestLogConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class BatchingConfig(_Section):
    """Server-side batching of concurrent requests (TF Serving's batching.config)."""

    enabled: bool = Field(True, description="Run concurrent requests to one signature as one call.")
    max_batch_size: int = Field(32, ge=1, description="The most rows in one batched call.")
    batch_timeout_micros: int = Field(
        1000, ge=0, description="TF Serving's wait for a batch to fill, written to batching.config for it; loopline's "
        "server does not wait (the running batch is the timeout).")
    num_batch_threads: int = Field(2, ge=1, description="Batches run at once; a request that finds them all busy "
                                                        "queues and is taken along by the next.")
    max_enqueued_batches: int = Field(
        100, ge=1, description="Queued work, in batches of max_batch_size requests; beyond it a request is refused "
        "with RESOURCE_EXHAUSTED (REST: 429).")


class LimitsConfig(_Section):
    """What one request or connection may hold. Requests are checked before their values reach
    NumPy or TensorFlow; HTTP limits are enforced while the REST request's head is read."""

    max_tensor_rank: int = Field(
        32, ge=1, le=32, description="The most dimensions one request tensor may have (gRPC and REST); more is "
        "INVALID_ARGUMENT (REST: 400). 32 is the most NumPy and TensorFlow's Python bridge hand over safely "
        "(TensorFlow's own limit is 254).")
    max_request_elements: int = Field(
        16 * 1024 * 1024, ge=1, description="The most values (numbers or strings) all of one request's tensors may "
        "hold together, counted from their shapes before any value is decoded (REST: counted from the body's "
        "commas before it is parsed); more is RESOURCE_EXHAUSTED (REST: 413). TF Serving has no such limit: its "
        "tensors are C++ arrays, where each string here is a Python object.")
    check_signature_shapes: bool | None = Field(
        None, description="Whether a request tensor's rank and known dimensions must match the signature's "
        "TensorSpec (INVALID_ARGUMENT, naming both, before the model runs). null: checked in loopline's start mode; "
        "not under TF Serving's flags, where, as in TF Serving, the model's own ops refuse what they cannot compute.")
    http_max_header_line_bytes: int = Field(
        16 * 1024, ge=256, description="The longest REST header line (name and value) or request URL; longer is "
        "answered 431 (414 for the URL) and the connection closed.")
    http_max_header_bytes: int = Field(
        64 * 1024, ge=1024, description="The most bytes of a REST request's head (request line and every header), "
        "counted as they arrive: an endless head is refused once it passes this, never held whole. More is "
        "answered 431 and the connection closed.")
    http_max_headers: int = Field(100, ge=1, description="The most header lines in one REST request; more is "
                                                          "answered 431 and the connection closed.")
    http_header_timeout_seconds: float = Field(
        10.0, gt=0, description="Seconds a client has to send a REST request's whole head, from its first byte; "
        "a slower or endless head is answered 408 and the connection closed. A kept-alive connection idle between "
        "requests is not timed by this but by http_keep_alive_seconds.")
    http_body_timeout_seconds: float = Field(
        60.0, gt=0, description="Seconds a REST request's body may go without a byte arriving once its head is "
        "complete (nginx's client_body_timeout); a stalled body's connection is answered 408 and closed.")
    http_keep_alive_seconds: float = Field(
        30.0, gt=0, description="Seconds an idle REST connection stays open: between requests, and before the first "
        "one.")
    http_max_connections: int = Field(
        1024, ge=1, description="The most REST connections open at once; one more is answered 503 and closed as soon "
        "as it is accepted (the client may retry); the open ones are not affected.")


class ServingConfig(_Section):
    model_name: str = Field("penguins", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description=(
        "The served model's name; pushes go to `<pipeline.root>/serving/<model_name>/<version>/`."))
    host: str = Field("127.0.0.1", description="The address the server binds (gRPC and REST).")
    grpc_port: int = Field(8500, ge=0, le=65535, description="gRPC port (0: any free port; the server prints it).")
    rest_port: int = Field(8501, ge=0, le=65535, description="REST port (0: any free port; the server prints it).")
    num_versions: int = Field(1, ge=1, description="Versions kept loaded: the newest N (TF Serving's `latest` policy) "
                                                   "unless labels pin others.")
    keep_versions: int = Field(
        5, ge=1, description="Version folders kept in the serving folder after a push: the newest N, plus any "
        "version models.config names or an MLflow alias points to; older ones are removed. At least num_versions.")
    poll_seconds: float = Field(2.0, gt=0, description="How often the server looks for new versions and models.config "
                                                       "changes.")
    max_request_bytes: int = Field(16 * 1024 * 1024, ge=1024, description=(
        "The largest request (gRPC message or REST body) accepted; larger ones get RESOURCE_EXHAUSTED (REST: 413)."))
    warmup: bool = Field(True, description="Replay the version's `assets.extra/tf_serving_warmup_requests` before "
                                           "routing to it; a version whose warmup fails is refused.")
    signature_method_name_check: bool = Field(
        False, description="TF Serving's --enable_signature_method_name_check (off there by default): Classify and "
        "Regress then need the signature's method name to be classify/regress, Predict one of the three.")
    tls_cert: str | None = Field(None, description="PEM certificate file for gRPC TLS; set with tls_key, it turns TLS on.")
    tls_key: str | None = Field(None, description="PEM private key file for gRPC TLS; set with tls_cert.")
    grpc_workers: int = Field(32, ge=1, description=(
        "gRPC threads: each takes calls from gRPC's queue and runs them itself (at most this many at once)."))
    # Concurrent requests already run side by side, so one inter-op thread avoids a hand-off per
    # call for small models.
    inter_op_threads: int = Field(1, ge=0, description=(
        "TensorFlow's inter-op thread pool in the server process (TF Serving's --tensorflow_inter_op_parallelism); "
        "0: TensorFlow chooses. Raise it for models with parallel branches."))
    intra_op_threads: int = Field(0, ge=0, description=(
        "TensorFlow's intra-op thread pool in the server process (TF Serving's --tensorflow_intra_op_parallelism); "
        "0: TensorFlow chooses."))
    # A 3-layer MLP at batch 1: ~130 us of ops with oneDNN, ~100 us without.
    onednn: bool = Field(False, description=(
        "oneDNN kernels (TF_ENABLE_ONEDNN_OPTS) in the `loopline serve` process: faster on large batches, slower per "
        "call on the small ones a server mostly sees. Takes effect only before TensorFlow is imported."))
    # The Python server holds one core's worth of work at a time (the GIL); on 2 shared cores,
    # pinned to one: p50 ~0.15 ms lower at 1 client, ~40% more requests/s at 16.
    cpus: list[Annotated[int, Field(ge=0)]] | None = Field(None, min_length=1, description=(
        "Pin `loopline serve` to these CPU ids (Linux), e.g. [1] to keep it off the cores its clients use; on one core "
        "its threads hand requests to each other without crossing cores. null: all CPUs."))
    prefer_tflite: bool = Field(False, description=(
        "Serve a version folder's `model.tflite` through the TFLite interpreter instead of its SavedModel, where it "
        "has one (TF Serving's --prefer_tflite_model); folders without one serve their SavedModel (docs/serving.md, "
        "TFLite models)."))
    tflite_variant: Literal["float32", "dynamic_range", "float16", "int8"] = Field("float32", description=(
        "The TFLite variant (export.tflite_variants) the Pusher writes into each version folder as `model.tflite`; "
        "a push whose model has no such variant (not exported, or dropped by the parity gate) writes none."))
    tflite_interpreters: int | None = Field(None, ge=1, description=(
        "Interpreters per loaded TFLite version (TF Serving's --num_tflite_pools): an interpreter runs one request "
        "at a time, so this is how many run at once. null: one per CPU, TF Serving's default."))
    limits: LimitsConfig = Field(LimitsConfig(), description=(
        "Request and connection limits, checked before anything reaches the model (docs/serving.md, Limits)."))
    batching: BatchingConfig = Field(BatchingConfig(), description=(
        "Server-side batching of concurrent requests (TF Serving's batching.config)."))
    request_log: RequestLogConfig = Field(RequestLogConfig(), description=(
        "Request logging: PredictionLog records of served requests under `<pipeline.root>/request_logs`, which "
        "`loopline monitor` reads."))
    allowed_base_paths: list[str] | None = Field(
        None, description="Base paths (folders or URIs, and what is inside them) that a model config sent over the "
        "network (ModelService.HandleReloadConfigRequest) may name; a config naming any other is refused whole. "
        "null: the serving root and the base paths of the config file the server was started with; []: none, "
        "which turns network reloads off. Config files given by the operator may name any absolute base path, "
        "as in TF Serving, which has no such check.")
    supervise: bool = Field(
        True, description="`loopline serve` runs the server in a child process and starts it again, on the same "
        "ports, when it dies of a crash in the model's code (SIGSEGV, SIGABRT); a version whose load or warmup "
        "crashed it is not loaded again until its files change (docs/serving.md, Containment). false: one process, "
        "for systemd or Kubernetes, which restart it themselves.")
    restart_delay_seconds: float = Field(
        0.5, ge=0, description="The wait before restarting a server process that died; it doubles with each rapid "
        "restart, up to 30 s.")
    max_rapid_restarts: int = Field(
        5, ge=0, description="Restarts in a row, each of a server process that died within a minute of its start, "
        "before `loopline serve` gives up with an error (exit code 1).")

    @field_validator("allowed_base_paths")
    @classmethod
    def _absolute(cls, paths):
        for path in paths or ():
            if "://" not in path and not os.path.isabs(path):
                raise ValueError(f"{path!r} is not an absolute path or a URI")
        return paths

    @model_validator(mode="after")
    def _keep_what_is_served(self):
        if self.keep_versions < self.num_versions:
            raise ValueError(f"serving.keep_versions ({self.keep_versions}) must be at least serving.num_versions "
                             f"({self.num_versions}), the versions the server loads")
        return self

    @model_validator(mode="after")
    def _tls_pair(self):
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("serving.tls_cert and serving.tls_key must be set together")
        return self
