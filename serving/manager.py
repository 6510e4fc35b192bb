"""The version lifecycle (TF Serving's AspiredVersionsManager and ServerCore): applies a
ModelServerConfig, loads and warms the versions the storage-path source (serving.storage_source)
aspires to before routing to them, unloads old ones after their in-flight requests, and resolves
requests' model specs (version or label) to a loaded version. `_lock` guards every map a request
or status reads (_models, each state's loaded and failed); loading happens outside it."""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field

import grpc
from tensorflow_serving.config import model_server_config_pb2

from serving.config import ServingConfig
from serving.errors import ServingError, invalid, not_found
from serving.model_config import is_remote, model_config_path, resolved_path, safe_base_path
from serving.request_log import OFF
from serving.servable import Servable
from serving.storage_source import StoragePathSource, aspired_versions, folder_fingerprint
from serving.warmup import warm_up

log = logging.getLogger("loopline.serving")


@dataclass
class ModelState:
    entry: model_server_config_pb2.ModelConfig
    loaded: dict[int, Servable] = field(default_factory=dict)
    # version -> (folder fingerprint, reason): a broken version is retried only once its files change
    failed: dict[int, tuple[tuple, str]] = field(default_factory=dict)


def load_servable(name: str, version: int, path: str, config: ServingConfig, max_elements: int, metrics=None) -> Servable:
    """Loads a version and replays its warmup requests (serving.warmup); raises with the reason
    when either fails, leaving nothing loaded."""
    servable = Servable(name, version, path, config.batching, max_elements, config.intra_op_threads)
    if config.warmup:
        try:
            warm_up(servable, config.signature_method_name_check, metrics)
        except ServingError as exc:
            servable.unload()
            raise ValueError(f"warmup failed: {exc.code.name}: {exc.message}") from None
    return servable


def _platform_problem(entry: model_server_config_pb2.ModelConfig) -> ServingError | None:
    """server_core.cc's GetPlatform and CreateAdapter: a platform must be named, and be tensorflow."""
    if not entry.model_platform:
        return invalid("Illegal setting neither ModelServerConfig::model_type (deprecated) nor "
                       f"ModelServerConfig::model_platform, model name is {entry.name}")
    if entry.model_platform != "tensorflow":
        return ServingError(grpc.StatusCode.FAILED_PRECONDITION, f"PlatformConfigMap has no entry for platform {entry.model_platform}")
    return None


class ModelManager:
    def __init__(self, serving_root: str, config: ServingConfig, models_config: str | None = None, metrics=None):
        self.serving_root = resolved_path(serving_root)
        self.config = config
        self.metrics = metrics
        self.method_check = config.signature_method_name_check
        self.models_config = models_config or model_config_path(serving_root)
        self._lock = threading.Lock()  # guards _models and every state's loaded and failed maps; loading happens outside it
        self._reconcile_lock = threading.Lock()
        self._models: dict[str, ModelState] = {}
        self.source = StoragePathSource(self.models_config, self.apply_config, self.reconcile, config.poll_seconds)
        self.max_elements = max(1, config.max_request_bytes)  # no element is smaller than a byte
        self.request_log = OFF  # the server's serving.request_log.RequestLog; the API code logs answers to it

    # -- configuration -------------------------------------------------------------------------
    def _checked_entries(self, server_config) -> dict[str, model_server_config_pb2.ModelConfig]:
        """TF Serving's ValidateModelConfigList and platform rules, then ours: a model's base path
        must be `<serving root>/<name>`. The first problem refuses the whole config."""
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
            try:
                base = safe_base_path(self.serving_root, entry.name)
                if resolved_path(entry.base_path) != base:
                    raise ValueError(f"base_path {entry.base_path!r} is not inside the serving root as <root>/{entry.name}")
            except ValueError as exc:
                raise invalid(f"model {entry.name}: {exc} (loopline serves only models under its serving root)") from None
            clean = model_server_config_pb2.ModelConfig()
            clean.CopyFrom(entry)
            clean.base_path = base
            entries[entry.name] = clean
        return entries

    def apply_config(self, server_config: model_server_config_pb2.ModelServerConfig) -> None:
        """Switches to a new ModelServerConfig (from the file or HandleReloadConfigRequest): loads
        what it asks for, then checks its labels (TF Serving's UpdateModelVersionLabelMap)."""
        entries = self._checked_entries(server_config)
        self.request_log.configure_models(entries)  # a logging_config loopline cannot honour refuses it all
        with self._lock:
            for name, entry in entries.items():
                state = self._models.get(name)
                if state is None:
                    self._models[name] = ModelState(entry)
                else:
                    state.entry = entry
            removed = [n for n in self._models if n not in entries]
        for name in removed:
            self._drop_model(name)
        self.reconcile()
        with self._lock:
            for name, entry in entries.items():
                for label, version in sorted(entry.version_labels.items()):
                    if version not in self._models[name].loaded:
                        raise ServingError(grpc.StatusCode.FAILED_PRECONDITION,
                                           f"Request to assign label to version {version} of model {name}, "
                                           "which is not currently available for inference")

    # -- versions ------------------------------------------------------------------------------
    def reconcile(self) -> None:
        with self._reconcile_lock:
            with self._lock:
                states = list(self._models.items())
            for name, state in states:
                self._reconcile_model(name, state)

    def _reconcile_model(self, name: str, state: ModelState) -> None:
        base = state.entry.base_path
        with self._lock:
            failed = dict(state.failed)
        wanted = aspired_versions(state.entry, failed)
        for version in wanted:
            if version in state.loaded:
                continue
            path = os.path.join(base, str(version))
            fingerprint = folder_fingerprint(path)
            try:
                servable = load_servable(name, version, path, self.config, self.max_elements, self.metrics)
            except Exception as exc:  # noqa: BLE001 - any load failure keeps the old version serving
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                with self._lock:  # status() reads it under the lock
                    state.failed[version] = (fingerprint, reason)
                log.error("model %s version %d refused, previous versions keep serving: %s", name, version, reason)
                continue
            with self._lock:
                state.failed.pop(version, None)
                state.loaded[version] = servable
            log.info("model %s version %d loaded and serving (signatures called through %s)", name, version,
                     servable.call_mode)
        loaded_wanted = [v for v in wanted if v in state.loaded]
        if not loaded_wanted:
            return  # availability first: never unload the last working version for a broken one
        for version in [v for v in state.loaded if v not in wanted]:
            with self._lock:
                old = state.loaded.pop(version)
            self._retire(old)

    def _retire(self, servable: Servable) -> None:
        def wait_and_unload():
            if not servable.wait_idle(timeout=60):
                log.warning("model %s version %d: requests still in flight after 60s; unloading", servable.name, servable.version)
            servable.unload()
            log.info("model %s version %d unloaded", servable.name, servable.version)

        threading.Thread(target=wait_and_unload, daemon=True).start()

    def _drop_model(self, name: str) -> None:
        with self._lock:
            state = self._models.pop(name, None)
        if state:
            for servable in state.loaded.values():
                self._retire(servable)

    # -- the source ---------------------------------------------------------------------------
    def start(self) -> None:
        self.source.start()

    def stop(self) -> None:
        self.source.stop()

    # -- requests ------------------------------------------------------------------------------
    def resolve(self, spec) -> Servable:
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

    def status(self, name: str, version: int | None = None) -> list[tuple[int, str, str]]:
        """[(version, state, error message)], TF Serving's ModelVersionStatus in plain values."""
        with self._lock:
            state = self._models.get(name)
            rows = [(v, "AVAILABLE", "") for v in state.loaded] if state else []
            rows += [(v, "END", reason) for v, (_, reason) in state.failed.items() if v not in state.loaded] if state else []
        if version is not None:
            rows = [r for r in rows if r[0] == version]
            if not rows:
                raise not_found(f"Could not find version {version} of model {name}")
        elif not rows:
            raise not_found(f"Could not find any versions of model {name}")
        return sorted(rows)

    def labels(self, name: str) -> dict[str, int]:
        with self._lock:
            state = self._models.get(name)
            return dict(state.entry.version_labels) if state else {}
