"""The `mlflow:` section turned into what tracking/ needs (kept apart from pipeline.py so the
registry commands do not import TFX)."""
from __future__ import annotations

from pipeline.config import ConfigError, LooplineConfig, is_remote


def tracking_target(config: LooplineConfig):
    """Where MLflow runs go (tracking.target.TrackingTarget), or None when `mlflow.enabled` is off."""
    section = config.mlflow
    if not section.enabled:
        return None
    if section.tracking_uri is None and is_remote(config.pipeline.root):
        # The embedded store is a SQLite file under the root: it cannot live on gs://...
        raise ConfigError(
            f"mlflow.tracking_uri is required when pipeline.root is remote ({config.pipeline.root}): "
            "set it to the MLflow server's URL (e.g. --set mlflow.tracking_uri=http://mlflow:5000), "
            "or --set mlflow.enabled=false")
    from tracking.target import TrackingTarget, embedded_store

    uri, artifacts = (section.tracking_uri, None) if section.tracking_uri else embedded_store(config.pipeline.root)
    return TrackingTarget(
        tracking_uri=uri, experiment=section.experiment, artifact_location=artifacts,
        flush_interval_s=section.flush_interval_s, close_timeout_s=section.close_timeout_s,
        http_retries=section.http_retries, http_timeout_s=section.http_timeout_s,
    )


def import_tracking(config: LooplineConfig) -> None:
    """Imports what the run's MLflow calls import on first use when `mlflow.enabled` (the client,
    the pyfunc flavour the Registrar logs and, for the embedded store, MLflow's SQLite stores), for
    a caller that wants them made up front: `loopline run` sets its imports aside from the cyclic
    collector, whose full scans would otherwise walk these (about 170k objects) for the whole run."""
    if not config.mlflow.enabled:
        return
    import mlflow.pyfunc  # noqa: F401  the flavour the Registrar logs
    import tracking.registration  # noqa: F401  mlflow and its client
    import tracking.training_run  # noqa: F401

    if config.mlflow.tracking_uri is None:
        import mlflow.store.model_registry.sqlalchemy_store  # noqa: F401
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401


def registered_model_name(config: LooplineConfig) -> str:
    return config.mlflow.registered_model or config.serving.model_name
