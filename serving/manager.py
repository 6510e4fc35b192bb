"""The version lifecycle (TF Serving's AspiredVersionsManager and ServerCore): applies a
ModelServerConfig, loads and warms the versions the storage-path source (serving.storage_source)
aspires to before routing to them, unloads old ones after their in-flight requests, and resolves
requests' model specs (version or label) to a loaded version. `_lock` guards every map a request
or status reads (_models, each state's loaded and failed); loading happens outside it.

A config file given by the operator may name any absolute base path, as in TF Serving. A config
sent over the network (HandleReloadConfigRequest) may only name paths under
serving.allowed_base_paths (by default the serving root and the base paths of the operator's
config file); TF Serving has no such check."""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import NamedTuple

import grpc
import tensorflow as tf
from tensorflow_serving.config import model_server_config_pb2

from serving.config import ServingConfig
from serving.errors import ServingError, invalid, not_found
from serving.load_journal import LoadJournal
from serving.model_config import is_remote, model_config_path, path_is_under, resolved_path
from serving.options import ServerOptions
from serving.request_log import OFF
from serving.request_limits import RequestLimits
from serving.servable import LoadedVersion, Servable, graph_error
from serving.tflite_servable import TfLiteServable, tflite_file
from serving.storage_source import StoragePathSource, aspired_versions, folder_fingerprint
from serving.warmup import warm_up

log = logging.getLogger("loopline.serving")
versions_log = logging.getLogger("loopline.serving.versions")  # `loopline serve` shows these on the terminal


class Failure(NamedTuple):
    fingerprint: tuple  # the version folder's files when the load failed: retried once they change
    code: grpc.StatusCode
    message: str


@dataclass
class ModelState:
    entry: model_server_config_pb2.ModelConfig
    loaded: dict[int, LoadedVersion] = field(default_factory=dict)
    failed: dict[int, Failure] = field(default_factory=dict)


def load_servable(name: str, version: int, path: str, config: ServingConfig, limits: RequestLimits, metrics=None,
                  options: ServerOptions | None = None) -> LoadedVersion:
    """Loads a version and replays its warmup requests (serving.warmup); raises with the reason
    when either fails, leaving nothing loaded. With serving.prefer_tflite a folder holding
    `model.tflite` is served through the TFLite interpreter (serving.tflite_servable); its
    warmup file, written for the SavedModel's signatures, is replayed only with TF Serving's
    rules, as TF Serving replays it."""
    options = options or ServerOptions()
    if config.prefer_tflite and tflite_file(path):
        servable = TfLiteServable(name, version, path, config.batching, limits,
                                  config.tflite_interpreters or os.cpu_count() or 1)
    else:
        servable = Servable(name, version, path, config.batching, limits, config.intra_op_threads,
                            options.saved_model_tags)
    if config.warmup and (options.tf_serving_rules or isinstance(servable, Servable)):
        try:
            warm_up(servable, config.signature_method_name_check, metrics, options.warmup_iterations)
        except ServingError as exc:
            servable.unload()
            raise ServingError(exc.code, f"warmup failed: {exc.message}") from None
    return servable


def as_failure(exc: Exception, fingerprint: tuple) -> Failure:
    """A load error with TF Serving's code: ours and TensorFlow's keep theirs, anything else is UNKNOWN."""
    if isinstance(exc, ServingError):
        return Failure(fingerprint, exc.code, exc.message)
    if isinstance(exc, tf.errors.OpError):
        error = graph_error(exc)
        return Failure(fingerprint, error.code, error.message)
    return Failure(fingerprint, grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}")


def _platform_problem(entry: model_server_config_pb2.ModelConfig) -> ServingError | None:
    """server_core.cc's GetPlatform and CreateAdapter: a platform must be named, and be tensorflow."""
    if not entry.model_platform:
        return invalid("Illegal setting neither ModelServerConfig::model_type (deprecated) nor "
                       f"ModelServerConfig::model_platform, model name is {entry.name}")
    if entry.model_platform != "tensorflow":
        return ServingError(grpc.StatusCode.FAILED_PRECONDITION, f"PlatformConfigMap has no entry for platform {entry.model_platform}")
    return None


class ModelManager:
    def __init__(self, serving_root: str | None, config: ServingConfig, models_config: str | None = None, metrics=None,
                 options: ServerOptions | None = None):
        self.serving_root = resolved_path(serving_root) if serving_root else None
        self.config = config
        self.metrics = metrics
        self.method_check = config.signature_method_name_check
        if options is None:
            options = ServerOptions.loopline(models_config or model_config_path(serving_root), config.poll_seconds)
        self.options = options
        self._lock = threading.Lock()  # guards _models and every state's loaded and failed maps; loading happens outside it
        self._reconcile_lock = threading.Lock()
        self._models: dict[str, ModelState] = {}
        self._operator_paths: list[str] = []  # the base paths of the operator's config
        self.source = StoragePathSource(options.models_config, self.apply_operator_config, self.reconcile,
                                        options.config_poll_seconds, options.version_poll_seconds, options.model_config)
        self.limits = RequestLimits.of(config, self.options.tf_serving_rules)
        self.request_log = OFF  # the server's serving.request_log.RequestLog; the API code logs answers to it
        self.load_journal = LoadJournal(None)  # a supervised server's (serving.load_journal): set before start()

    # -- configuration -------------------------------------------------------------------------
    def allowed_base_paths(self) -> list[str]:
        if self.config.allowed_base_paths is not None:
            return list(self.config.allowed_base_paths)
        return ([self.serving_root] if self.serving_root else []) + self._operator_paths

    def _checked_entries(self, server_config, from_network: bool) -> dict[str, model_server_config_pb2.ModelConfig]:
        """TF Serving's ValidateModelConfigList and platform rules; over the network, ours: every
        base path under serving.allowed_base_paths. The first problem refuses the whole config."""
        if from_network and not self.allowed_base_paths():
            raise ServingError(grpc.StatusCode.PERMISSION_DENIED,
                               "model configs sent over the network are turned off (serving.allowed_base_paths is empty)")
        if server_config.WhichOneof("config") != "model_config_list":
            raise invalid("ServerModelConfig type not supported by HandleReloadConfigRequest. "
                          "Only ModelConfigList is currently supported")
        entries = {}
        for entry in server_config.model_config_list.config:
            if entry.name in entries:
                raise invalid(f"Illegal to list model {entry.name} multiple times in config list")
            if not (is_remote(entry.base_path) or os.path.isabs(entry.base_path)):
                raise invalid(f"Expected model {entry.name} to have an absolute path or URI; got base_path()={entry.base_path}")
            problem = _platform_problem(entry)
            if problem is not None:
                raise problem
            clean = model_server_config_pb2.ModelConfig()
            clean.CopyFrom(entry)
            if from_network:
                allowed = self.allowed_base_paths()
                if not path_is_under(entry.base_path, allowed):
                    raise ServingError(grpc.StatusCode.PERMISSION_DENIED,
                                       f"model {entry.name}: base_path {entry.base_path} is not under "
                                       f"serving.allowed_base_paths {allowed}; a config sent over the network may "
                                       "only name those (loopline's rule)")
                clean.base_path = resolved_path(entry.base_path)  # what was checked is what is read
            entries[entry.name] = clean
        return entries

    def apply_operator_config(self, server_config: model_server_config_pb2.ModelServerConfig) -> None:
        """The operator's config (the file, or the command line's model): trusted, as in TF Serving."""
        self.apply_config(server_config, from_network=False)

    def apply_config(self, server_config: model_server_config_pb2.ModelServerConfig, *, from_network: bool) -> None:
        """Switches to a new ModelServerConfig (ServerCore::ReloadConfig): checks it, its labels
        (UpdateModelVersionLabelMap: before loading with TF Serving's rules, after with loopline's),
        loads what it asks for; over the network, answers UNKNOWN when a model it adds fails to load."""
        entries = self._checked_entries(server_config, from_network)
        self.request_log.configure_models(entries)  # a logging_config loopline cannot honour refuses it all
        if not from_network:
            self._operator_paths = [e.base_path for e in entries.values()]
        tf_rules = self.options.tf_serving_rules
        if tf_rules:
            self._check_labels(entries)
        with self._lock:
            added = [name for name in entries if name not in self._models]
            for name, entry in entries.items():
                state = self._models.get(name)
                if state is None:
                    self._models[name] = ModelState(entry, failed=self._crashed_versions(name))
                else:
                    state.entry = entry
            removed = [n for n in self._models if n not in entries]
        for name in removed:
            self._drop_model(name)
        self.reconcile()
        if not tf_rules:
            self._check_labels(entries)
        if from_network:
            self._check_added(added)

    def _check_labels(self, entries: dict) -> None:
        """Each label must name a loaded version; with --allow_version_labels_for_unavailable_models
        a new label, or one keeping its version, may name any version."""
        with self._lock:
            for name, entry in entries.items():
                state = self._models.get(name)
                loaded = state.loaded if state else {}
                current = state.entry.version_labels if state else {}
                for label, version in sorted(entry.version_labels.items()):
                    if version in loaded:
                        continue
                    if self.options.allow_unavailable_labels and current.get(label, version) == version:
                        continue
                    raise ServingError(grpc.StatusCode.FAILED_PRECONDITION,
                                       f"Request to assign label to version {version} of model {name}, "
                                       "which is not currently available for inference")

    def _check_added(self, added: list[str]) -> None:
        """WaitUntilModelsAvailable for the models a config adds: one whose versions all failed is an
        error (TF Serving also waits for a model without versions; here that one is not waited for)."""
        with self._lock:
            failed = [(name, v, f) for name in added if (state := self._models.get(name)) and not state.loaded
                      for v, f in sorted(state.failed.items())]
        if failed:
            details = "".join(f"{{{{name: {name} version: {v}}} due to error: {f.code.name}: {f.message}}}, "
                              for name, v, f in failed)
            raise ServingError(grpc.StatusCode.UNKNOWN,
                               f"{len({n for n, _, _ in failed})} model(s) did not become available: {{{details}}}")

    # -- versions ------------------------------------------------------------------------------
    def reconcile(self) -> None:
        if self.options.version_poll_seconds < 0:
            return  # TF Serving's negative --file_system_poll_wait_seconds: never look
        with self._reconcile_lock:
            with self._lock:
                states = list(self._models.items())
            for name, state in states:
                self._reconcile_model(name, state)

    def _reconcile_model(self, name: str, state: ModelState) -> None:
        with self._lock:
            failed = dict(state.failed)
        wanted = aspired_versions(state.entry, failed, keep_labelled=not self.options.tf_serving_rules)
        for version, path in wanted.items():
            if version in state.loaded:
                continue
            fingerprint = folder_fingerprint(path)
            try:
                with self.load_journal.loading(name, version, path, fingerprint):
                    servable = load_servable(name, version, path, self.config, self.limits, self.metrics, self.options)
            except Exception as exc:  # noqa: BLE001 - any load failure keeps the old version serving
                failure = as_failure(exc, fingerprint)
                with self._lock:  # status() reads it under the lock
                    state.failed[version] = failure
                log.error("model %s version %d refused, previous versions keep serving: %s: %s (folder %s)", name,
                          version, failure.code.name, failure.message, path)
                continue
            with self._lock:
                state.failed.pop(version, None)
                state.loaded[version] = servable
            versions_log.info("model %s version %d loaded and serving (folder %s, signatures called through %s)", name,
                              version, path, servable.call_mode)
        loaded_wanted = [v for v in wanted if v in state.loaded]
        if not loaded_wanted:
            return  # availability first: never unload the last working version for a broken one
        for version in [v for v in state.loaded if v not in wanted]:
            with self._lock:
                old = state.loaded.pop(version)
            self._retire(old)

    def _crashed_versions(self, name: str) -> dict[int, Failure]:
        """The versions of `name` whose load killed an earlier server process: refused as failed loads are."""
        return {version: Failure(fingerprint, grpc.StatusCode.UNKNOWN, message)
                for version, (fingerprint, message) in self.load_journal.crashed_versions(name).items()}

    def _retire(self, servable: LoadedVersion) -> None:
        def wait_and_unload():
            if not servable.wait_idle(timeout=60):
                log.warning("model %s version %d: requests still in flight after 60s; unloading", servable.name, servable.version)
            servable.unload()
            versions_log.info("model %s version %d unloaded", servable.name, servable.version)

        threading.Thread(target=wait_and_unload, daemon=True).start()

    def _drop_model(self, name: str) -> None:
        with self._lock:
            state = self._models.pop(name, None)
        if state:
            for servable in state.loaded.values():
                self._retire(servable)

    # -- the source ---------------------------------------------------------------------------
    def start(self) -> None:
        """Applies the operator's config and loads its models. With TF Serving's rules a config that
        cannot be read or applied, or a model whose versions all fail, stops the start-up."""
        self.source.start(strict=self.options.tf_serving_rules)
        if self.options.tf_serving_rules:
            with self._lock:
                names = list(self._models)
            self._check_added(names)

    def stop(self) -> None:
        self.source.stop()

    def models_without_versions(self) -> list[str]:
        """Models with nothing loaded and nothing refused yet (TF Serving waits for them at start-up)."""
        with self._lock:
            return sorted(name for name, state in self._models.items() if not state.loaded and not state.failed)

    # -- requests ------------------------------------------------------------------------------
    def resolve(self, spec) -> LoadedVersion:
        """The loaded version a ModelSpec asks for, counted in flight: use it as `with resolve(spec) as s:`.
        TF Serving's ServerCore::GetServableHandle, with its codes and messages."""
        name = spec.name
        if not name:
            raise invalid("ModelSpec has no name specified.")
        which = spec.WhichOneof("version_choice")
        with self._lock:
            state = self._models.get(name)
            if which == "version_label":
                labels = state.entry.version_labels if state is not None else {}
                if spec.version_label not in labels:
                    raise invalid(f"Unrecognized servable version label: {spec.version_label}")
                version = labels[spec.version_label]
            else:
                version = spec.version.value if which == "version" else None
            loaded = state.loaded if state is not None else {}
            if version is None:
                servable = loaded[max(loaded)] if loaded else None
                request = f"Latest({name})"
            else:
                servable = loaded.get(version)
                request = f"Specific({name}, {version})"
            if servable is None:
                raise not_found(f"Servable not found for request: {request}")
            servable.acquire()  # counted in flight before the lock is released
        return servable

    def status(self, name: str, version: int | None = None) -> list[tuple[int, str, grpc.StatusCode, str]]:
        """[(version, state, code, error message)], TF Serving's ModelVersionStatus in plain values."""
        with self._lock:
            state = self._models.get(name)
            rows = [(v, "AVAILABLE", grpc.StatusCode.OK, "") for v in state.loaded] if state else []
            rows += [(v, "END", f.code, f.message) for v, f in state.failed.items() if v not in state.loaded] if state else []
        if version is not None:
            rows = [r for r in rows if r[0] == version]
            if not rows:
                raise not_found(f"Could not find version {version} of model {name}")
        elif not rows:
            raise not_found(f"Could not find any versions of model {name}")
        return sorted(rows, key=lambda r: r[0])

    def labels(self, name: str) -> dict[str, int]:
        with self._lock:
            state = self._models.get(name)
            return dict(state.entry.version_labels) if state else {}
