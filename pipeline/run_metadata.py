"""Reading a pipeline's runs back from ML Metadata (SQLite): the store, and the newest run's
artifacts. Readers of a finished run (the run summary, the data report, accepting data changes)
use this, not the runner."""
from __future__ import annotations

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from pipeline.config import LooplineConfig
from pipeline.pipeline import metadata_path


def open_store(config: LooplineConfig) -> metadata_store.MetadataStore:
    connection = metadata_store_pb2.ConnectionConfig()
    connection.sqlite.filename_uri = metadata_path(config)
    connection.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
    return metadata_store.MetadataStore(connection)


def newest_run_artifacts(store: metadata_store.MetadataStore):
    """The newest pipeline run's context and its newest artifact of each type ({type name: artifact});
    (None, {}) when no run is recorded."""
    runs = store.get_contexts_by_type("pipeline_run")
    if not runs:
        return None, {}
    run = max(runs, key=lambda c: c.id)
    types = {t.id: t.name for t in store.get_artifact_types()}
    newest: dict[str, metadata_store_pb2.Artifact] = {}
    for artifact in store.get_artifacts_by_context(run.id):
        name = types[artifact.type_id]
        if name not in newest or artifact.id > newest[name].id:
            newest[name] = artifact
    return run, newest
