"""Aliases: move an MLflow alias (champion, challenger...) to a model version, or back to its
previous holder, and make TF Serving's version labels in models.config follow.

History is kept in MLflow itself: each promotion tags the new holder with the version it replaced
(`loopline.previous.<alias>`), so a rollback is a walk down that chain, and the registered model
carries an event log (`loopline.alias_history.<alias>`, newest last).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

from tracking.registration import TAG_SERVING_VERSION

HISTORY_KEEP = 20


class PromotionError(ValueError):
    """A promotion that cannot be done, saying why."""


@dataclass
class Promotion:
    model: str
    alias: str
    version: str
    previous: str | None
    serving_label: str | None = None
    serving_version: int | None = None
    models_config: str | None = None  # the file rewritten, if any
    removed_version: int | None = None  # the serving version retention had removed (pushed again)

    def lines(self) -> list[str]:
        out = [f"{self.model}@{self.alias}: version {self.previous or '(none)'} -> {self.version}"]
        if self.removed_version is not None:
            out.append(f"serving version {self.removed_version} had been removed from the serving folder; "
                       f"pushed again from the registry as {self.serving_version}")
        if self.models_config:
            out.append(f"TF Serving label '{self.serving_label}' -> version {self.serving_version} in {self.models_config}")
        return out


def previous_tag(alias: str) -> str:
    return f"loopline.previous.{alias}"


def history_tag(alias: str) -> str:
    return f"loopline.alias_history.{alias}"


def aliased_serving_versions(client, model: str) -> set[int]:
    """The TF Serving versions the registered model's aliases point to (none when the model is not
    registered yet). Raises when the registry cannot answer."""
    from mlflow.exceptions import MlflowException

    try:
        aliases = client.get_registered_model(model).aliases or {}
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return set()
        raise
    versions = set()
    for version in set(aliases.values()):
        serving_version = client.get_model_version(model, str(version)).tags.get(TAG_SERVING_VERSION)
        if serving_version and serving_version.isdigit():
            versions.add(int(serving_version))
    return versions


def alias_holder(client, model: str, alias: str) -> str | None:
    try:
        return str(client.get_model_version_by_alias(model, alias).version)
    except Exception:
        return None


def _get_version(client, model: str, version: str):
    try:
        return client.get_model_version(model, str(version))
    except Exception:
        known = sorted(int(v.version) for v in client.search_model_versions(f"name = '{model}'"))
        if not known:
            raise PromotionError(f"registered model {model!r} has no versions (is the name right?)") from None
        raise PromotionError(f"model {model!r} has no version {version}; versions are {known}") from None


def _record(client, model: str, alias: str, action: str, version: str, previous: str | None) -> None:
    registered = client.get_registered_model(model)
    try:
        history = json.loads(registered.tags.get(history_tag(alias), "[]"))
    except ValueError:
        history = []
    history.append({"time": int(time.time()), "action": action, "version": version, "previous": previous})
    client.set_registered_model_tag(model, history_tag(alias), json.dumps(history[-HISTORY_KEEP:]))


def move_alias(client, model: str, alias: str, version: str | None = None, rollback: bool = False) -> Promotion:
    """Points `alias` at `version`, or with rollback=True back at the holder before the current one."""
    current = alias_holder(client, model, alias)
    if rollback:
        if current is None:
            raise PromotionError(f"{model}@{alias} is not set; nothing to roll back")
        target = _get_version(client, model, current).tags.get(previous_tag(alias))
        if not target:
            raise PromotionError(f"{model}@{alias} (version {current}) has no previous holder to roll back to")
        _get_version(client, model, target)
        client.set_registered_model_alias(model, alias, target)
        _record(client, model, alias, "rollback", target, current)
        return Promotion(model, alias, target, current)
    if version is None:
        raise PromotionError("give a version to promote, or rollback")
    _get_version(client, model, version)
    version = str(version)
    if current == version:
        return Promotion(model, alias, version, current)
    if current is not None:
        client.set_model_version_tag(model, version, previous_tag(alias), current)
    client.set_registered_model_alias(model, alias, version)
    _record(client, model, alias, "promote", version, current)
    return Promotion(model, alias, version, current)


def follow_in_serving(client, promotion: Promotion, models_config: str, served_name: str, label: str) -> Promotion:
    """Sets TF Serving's version label `label` to the promoted version's pushed (serving) version,
    pushing the registered model again when retention removed that version's folder."""
    import os

    import tensorflow as tf  # the serving root may be on gs://...

    from serving.config_writer import models_config_lock
    from serving.model_config import available_versions, safe_base_path, set_version_labels

    tags = _get_version(client, promotion.model, promotion.version).tags
    serving_version = tags.get(TAG_SERVING_VERSION)
    if not serving_version:
        raise PromotionError(
            f"{promotion.model} version {promotion.version} has no '{TAG_SERVING_VERSION}' tag (it was not pushed), "
            f"so TF Serving's label '{label}' cannot follow; the MLflow alias was moved")
    if not tf.io.gfile.exists(models_config):
        raise PromotionError(f"{models_config} does not exist (nothing served yet); the MLflow alias was moved")
    serving_root = os.path.dirname(models_config)
    base = safe_base_path(serving_root, served_name)
    version = int(serving_version)
    if version not in available_versions(base):
        promotion.removed_version = version
        version = _push_again(client, promotion, base)
    with models_config_lock(serving_root):
        set_version_labels(models_config, served_name, {label: version})
    promotion.serving_label, promotion.serving_version, promotion.models_config = label, version, models_config
    return promotion


def _push_again(client, promotion: Promotion, base: str) -> int:
    """Pushes the registered version's SavedModel (from its logged MLflow model) as a new serving
    version and re-tags the registered version with it."""
    import os
    import tempfile

    from mlflow.artifacts import download_artifacts
    from mlflow.models import Model

    from serving.push import push_model
    from tracking.logged_model import fluent_tracking_uri

    try:
        with tempfile.TemporaryDirectory() as scratch, fluent_tracking_uri(client.tracking_uri):
            uri = client.get_model_version_download_uri(promotion.model, promotion.version)
            local = download_artifacts(artifact_uri=uri, dst_path=scratch)
            saved_model = Model.load(local).flavors["python_function"]["artifacts"]["saved_model"]["path"]
            pushed = push_model(os.path.join(local, saved_model), base)
    except Exception as exc:  # noqa: BLE001 - said in one line; the alias has moved already
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise PromotionError(
            f"{promotion.model} version {promotion.version}: its serving version {promotion.removed_version} was "
            f"removed from {base} and the registered model could not be pushed again ({first}); "
            "the MLflow alias was moved, TF Serving's labels were not") from None
    client.set_model_version_tag(promotion.model, promotion.version, TAG_SERVING_VERSION, str(pushed.version))
    return pushed.version


@dataclass
class VersionRow:
    version: str
    aliases: list[str]
    serving_version: str | None
    created: str
    run_id: str | None
    metrics: dict[str, float]


def list_versions(client, model: str, metric_prefix: str = "final_eval/") -> list[VersionRow]:
    registered = client.get_registered_model(model)
    aliases: dict[str, list[str]] = {}
    for alias, version in (registered.aliases or {}).items():
        aliases.setdefault(str(version), []).append(alias)
    rows = []
    for mv in sorted(client.search_model_versions(f"name = '{model}'"), key=lambda v: int(v.version), reverse=True):
        metrics = {}
        if mv.run_id:
            try:
                run_metrics = client.get_run(mv.run_id).data.metrics
                metrics = {k[len(metric_prefix):]: v for k, v in run_metrics.items() if k.startswith(metric_prefix)}
            except Exception:
                pass
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(mv.creation_timestamp / 1000))
        rows.append(VersionRow(str(mv.version), sorted(aliases.get(str(mv.version), [])),
                               mv.tags.get(TAG_SERVING_VERSION), created, mv.run_id, metrics))
    return rows


def format_table(rows: list[VersionRow]) -> str:
    keys = sorted({k for r in rows for k in r.metrics if not k.endswith("_examples")})
    header = ["version", "aliases", "serving", "created", "run", *keys]
    body = [[r.version, ",".join(r.aliases) or "-", r.serving_version or "-", r.created, (r.run_id or "-")[:12],
             *(f"{r.metrics[k]:.4g}" if k in r.metrics else "-" for k in keys)] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [header, *body])
