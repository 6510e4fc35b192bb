"""Reading a pipeline's runs back from ML Metadata (SQLite): the store, one run's context and its
artifacts. Readers of a finished run (the run summary, the data report, accepting data changes)
use this, not the runner.

A run is read by its own id (the pipeline-run context LocalDagRunner names after it) or, for
commands that come later, as the newest run the local runner marked finished: never simply the
newest context, which may belong to a run still going (or killed) on the same file."""
from __future__ import annotations

import os
import time

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from pipeline.config import LooplineConfig
from pipeline.pipeline import metadata_path

RUN_CONTEXT = "pipeline_run"
# Set on a run's context by the local runner when the run ends (finished or failed).
FINISHED_AT = "loopline_finished_at"  # ms since the epoch
OUTCOME = "loopline_outcome"  # "succeeded" or "failed: <error type>"


def open_store(config: LooplineConfig, read_only: bool = False) -> metadata_store.MetadataStore:
    """The run's store. `read_only`: for commands that only read; it never creates the file (a
    missing one is FileNotFoundError). A read waits out a running pipeline's write: ML Metadata's
    SQLite source retries a locked database itself (about 30 s with ml-metadata 1.17, measured)."""
    path = metadata_path(config)
    connection = metadata_store_pb2.ConnectionConfig()
    connection.sqlite.filename_uri = path
    if not read_only:
        connection.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
        return metadata_store.MetadataStore(connection)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no pipeline runs yet under {config.pipeline.root} (run `loopline run` first)")
    connection.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READONLY
    return metadata_store.MetadataStore(connection)


def run_context(store, run_id: str) -> metadata_store_pb2.Context | None:
    return store.get_context_by_type_and_name(RUN_CONTEXT, run_id)


def newest_finished_run(store) -> metadata_store_pb2.Context | None:
    """The newest run the local runner marked finished (succeeded or failed)."""
    finished = [c for c in store.get_contexts_by_type(RUN_CONTEXT) if FINISHED_AT in c.custom_properties]
    return max(finished, key=lambda c: c.custom_properties[FINISHED_AT].int_value, default=None)


def mark_finished(store, run_id: str, outcome: str) -> None:
    """Records on the run's context that it ended (no context: it failed before its first step)."""
    context = run_context(store, run_id)
    if context is None:
        return
    context.custom_properties[FINISHED_AT].int_value = int(time.time() * 1000)
    context.custom_properties[OUTCOME].string_value = outcome
    store.put_contexts([context])


def node_outputs(store, run_id: str, pipeline_name: str, node_id: str) -> tuple[str, dict] | None:
    """One component's newest execution in a run: its state name (COMPLETE, CACHED...) and its
    output artifacts ({type name: artifact}); None when it has none in that run."""
    run = run_context(store, run_id)
    node = store.get_context_by_type_and_name("node", f"{pipeline_name}.{node_id}")
    if run is None or node is None:
        return None
    ours = {e.id for e in store.get_executions_by_context(node.id)}
    executions = [e for e in store.get_executions_by_context(run.id) if e.id in ours]
    if not executions:
        return None
    execution = max(executions, key=lambda e: e.id)
    output_ids = [e.artifact_id for e in store.get_events_by_execution_ids([execution.id])
                  if e.type == metadata_store_pb2.Event.OUTPUT]
    types = {t.id: t.name for t in store.get_artifact_types()}
    outputs = {types[a.type_id]: a for a in store.get_artifacts_by_id(output_ids)}
    return metadata_store_pb2.Execution.State.Name(execution.last_known_state), outputs


def run_artifacts(store, run: metadata_store_pb2.Context) -> dict[str, metadata_store_pb2.Artifact]:
    """The run's newest artifact of each type ({type name: artifact})."""
    types = {t.id: t.name for t in store.get_artifact_types()}
    newest: dict[str, metadata_store_pb2.Artifact] = {}
    for artifact in store.get_artifacts_by_context(run.id):
        name = types[artifact.type_id]
        if name not in newest or artifact.id > newest[name].id:
            newest[name] = artifact
    return newest
