"""A pushed version's lineage as a plain dict: the data files and their hashes, the statistics, the
data baseline the run was checked against, the config, the git commit, the MLflow run and
registered version, the blessing and the champion it replaced.

Built from ML Metadata artifact protos, so the Registrar (its input artifacts, while the pipeline
runs) and `loopline lineage` (the same artifacts found again in ML Metadata) give one answer.
No TFX here: the callers hand in the protos."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

import tensorflow as tf

HASH_CHUNK = 1 << 20
MAX_FILES = 200  # listed one by one; beyond that the card gives their count and one combined digest


@dataclass
class LineageInputs:
    """What the lineage is made of; artifacts are ML Metadata protos (None when absent)."""
    model_name: str
    version: str
    pushed: object
    model: object
    examples: object = None
    statistics: object = None
    schema: object = None
    anomalies: object = None
    blessing: object = None
    model_run: object = None
    data_patterns: list[str] = field(default_factory=list)  # what ExampleGen read (globs, files or folders)
    params: dict[str, str] = field(default_factory=dict)  # the resolved config, flat
    pipeline_name: str = ""
    pipeline_run_id: str = ""
    mlflow: dict = field(default_factory=dict)  # tracking_uri, run_id, registered_model, registered_version
    git_commit: str | None = None


def prop(artifact, key: str, default=None):
    """A property or custom property of an ML Metadata artifact, whatever its value kind (Kubeflow
    hands custom properties in as struct values)."""
    if artifact is None:
        return default
    for props in (artifact.properties, artifact.custom_properties):
        if key in props:
            value = props[key]
            kind = value.WhichOneof("value")
            if kind == "struct_value":
                from google.protobuf.json_format import MessageToDict

                return MessageToDict(value.struct_value)
            return getattr(value, kind) if kind else default
    return default


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as f:  # data may be on gs://
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def data_files(patterns: list[str]) -> dict:
    """The files behind `patterns` (globs, files, or folders walked), each with its sha256 and size."""
    paths: list[str] = []
    for pattern in patterns:
        for match in sorted(tf.io.gfile.glob(pattern)):
            if tf.io.gfile.isdir(match):
                paths += sorted(os.path.join(d, f) for d, _, files in tf.io.gfile.walk(match) for f in files)
            else:
                paths.append(match)
    files = [{"path": p, "sha256": file_sha256(p), "bytes": tf.io.gfile.stat(p).length} for p in paths]
    combined = hashlib.sha256("".join(f["sha256"] for f in files).encode()).hexdigest()
    return {"patterns": patterns, "count": len(files), "combined_sha256": combined, "files": files[:MAX_FILES]}


def split_examples(statistics) -> dict[str, int]:
    """{split: examples} from StatisticsGen's artifact."""
    from validation.statistics import read_statistics

    splits = json.loads(prop(statistics, "split_names", "[]"))
    return {s: int(read_statistics(os.path.join(statistics.uri, f"Split-{s}")).num_examples) for s in splits}


def _artifact(artifact, **extra) -> dict | None:
    if artifact is None:
        return None
    return {"mlmd_id": artifact.id, "uri": artifact.uri, **extra}


def _champion(blessing) -> dict | None:
    path = prop(blessing, "baseline_model", "") or ""
    if not path:
        return None
    tail = os.path.basename(path.rstrip("/"))
    return {"path": path, "version": tail if tail.isdigit() else None}


def build_lineage(inputs: LineageInputs) -> dict:
    """The lineage of one pushed version, every value JSON-ready."""
    anomalies = inputs.anomalies
    return {
        "model": inputs.model_name,
        "version": str(inputs.version),
        "pushed": _artifact(inputs.pushed, path=prop(inputs.pushed, "pushed_destination")),
        "pipeline": {"name": inputs.pipeline_name, "run_id": inputs.pipeline_run_id},
        "data": {**data_files(inputs.data_patterns),
                 "examples": _artifact(inputs.examples, span=prop(inputs.examples, "span"),
                                       input_fingerprint=prop(inputs.examples, "input_fingerprint"))},
        "statistics": _artifact(inputs.statistics, examples=split_examples(inputs.statistics)
                                if inputs.statistics is not None else {}),
        "schema": _artifact(inputs.schema, source=prop(inputs.schema, "source")),
        "data_baseline": _artifact(anomalies, description=prop(anomalies, "baseline", ""),
                                   location=prop(anomalies, "baseline_location", ""),
                                   anomalies=prop(anomalies, "anomaly_count", 0),
                                   accepted_changes=prop(anomalies, "accepted_changes", "")),
        "model_artifact": _artifact(inputs.model, exported=json.loads(prop(inputs.model, "exported", "") or "null")),
        "trainer_run": _artifact(inputs.model_run),
        "blessing": _artifact(inputs.blessing, blessed=bool(prop(inputs.blessing, "blessed", 0))),
        "champion_replaced": _champion(inputs.blessing),
        "config": dict(sorted(inputs.params.items())),
        "git_commit": inputs.git_commit,
        "mlflow": inputs.mlflow,
    }


def lineage_lines(lineage: dict) -> list[str]:
    """The lineage as the text `loopline lineage` prints."""
    def uri(key: str) -> str:
        found = lineage.get(key)
        return f"{found['uri']} (ML Metadata artifact {found['mlmd_id']})" if found else "(none)"

    data, mlflow, champion = lineage["data"], lineage["mlflow"] or {}, lineage["champion_replaced"]
    baseline = lineage["data_baseline"] or {}
    out = [f"model      {lineage['model']} version {lineage['version']}",
           f"pushed to  {(lineage['pushed'] or {}).get('path')}",
           f"pipeline   {lineage['pipeline']['name']} run {lineage['pipeline']['run_id']}",
           f"data       {data['count']} file(s), combined sha256 {data['combined_sha256']}"]
    out += [f"           {f['sha256']}  {f['bytes']:>10} B  {f['path']}" for f in data["files"]]
    if data["examples"]:
        out.append(f"examples   {data['examples']['uri']} (input fingerprint "
                   f"{data['examples']['input_fingerprint']})")
    stats = lineage["statistics"]
    out.append(f"statistics {uri('statistics')}" + (
        f"; examples {', '.join(f'{k} {v}' for k, v in stats['examples'].items())}" if stats else ""))
    out.append(f"schema     {uri('schema')}")
    out.append(f"baseline   {baseline.get('description') or '(not recorded)'}")
    out.append(f"model      {uri('model_artifact')}")
    out.append(f"blessing   {uri('blessing')}")
    out.append(f"replaced   {'version ' + str(champion['version']) if champion else 'no champion (first model)'}")
    out.append(f"git        {lineage['git_commit'] or '(not recorded)'}")
    out.append(f"mlflow     {mlflow['error']}" if mlflow.get("error") else
               f"mlflow     run {mlflow.get('run_id') or '(none)'}; registered {mlflow.get('registered_model')} "
               f"version {mlflow.get('registered_version') or '(none)'}")
    out.append(f"config     {len(lineage['config'])} keys (--json shows them)")
    return out
