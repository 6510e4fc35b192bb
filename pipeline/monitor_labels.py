"""Labels that arrive after the answers: a CSV or Parquet file of request ids and true labels,
joined to the logged answers through the request log's sidecar index (the id the server
returned in `x-request-id`), scored with the Evaluator's metric code (trainer.evaluation's
head_metrics: HeadTotals), per head.

Columns: `request_id`; a label column per head to score, named as in the data (`species`...);
`example_index` (0-based, the example's position in its request) when requests held several
examples. Rows whose request is not in the window, or whose example is not in it, are counted,
not scored."""
from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import tensorflow as tf

from trainer.evaluation import head_metrics
from trainer.heads import CLASSIFICATION, Head

REQUEST_ID, EXAMPLE_INDEX = "request_id", "example_index"


@dataclass
class Labels:
    frame: pd.DataFrame
    path: str

    @property
    def request_ids(self) -> set[str]:
        return set(self.frame[REQUEST_ID])


def read_labels(path: str) -> Labels:
    """A .csv or .parquet file (through tf.io.gfile: it may be in a bucket); errors name the file."""
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"labels file not found: {path}")
    with tf.io.gfile.GFile(path, "rb") as f:
        content = f.read()
    lower = path.lower()
    if lower.endswith(".csv"):
        frame = pd.read_csv(io.BytesIO(content), dtype=str, keep_default_na=False)  # labels as written
    elif lower.endswith((".parquet", ".pq")):
        frame = pd.read_parquet(io.BytesIO(content))
    else:
        raise ValueError(f"{path}: labels must be a .csv or .parquet file")
    if REQUEST_ID not in frame.columns:
        raise ValueError(f"{path}: no '{REQUEST_ID}' column (columns: {list(frame.columns)}); give each label the "
                         "x-request-id the server returned with its answer")
    frame[REQUEST_ID] = frame[REQUEST_ID].astype(str)
    if EXAMPLE_INDEX in frame.columns:
        try:
            frame[EXAMPLE_INDEX] = pd.to_numeric(frame[EXAMPLE_INDEX], errors="raise").astype(int)
        except (ValueError, TypeError):
            raise ValueError(f"{path}: '{EXAMPLE_INDEX}' must hold whole numbers") from None
    else:
        frame[EXAMPLE_INDEX] = 0
    return Labels(frame, path)


@dataclass
class LiveMetrics:
    metrics: dict[str, float]
    labelled: int  # rows in the labels file
    joined: int  # rows joined to a logged answer of the window
    not_joined: dict[str, int] = field(default_factory=dict)  # why, -> rows
    eval: dict[str, float] = field(default_factory=dict)  # the version's own eval metrics, when MLflow has them

    def to_json(self) -> dict:
        return {"metrics": self.metrics, "labelled": self.labelled, "joined": self.joined, "not_joined": self.not_joined,
                "eval_metrics": self.eval}


def _label_values(column: pd.Series, head: Head) -> np.ndarray:
    """A label column as head_metrics takes it (`[rows, 1]`): text for classes (missing: ""),
    float32 for values (missing: NaN)."""
    if head.kind == CLASSIFICATION:
        text = ["" if v is None or (isinstance(v, float) and np.isnan(v)) else
                str(int(v)) if isinstance(v, (float, np.floating)) and float(v).is_integer() else str(v) for v in column]
        return np.array(text, dtype=object).reshape(-1, 1)
    return pd.to_numeric(column, errors="coerce").to_numpy(np.float32).reshape(-1, 1)


def join_labels(labels: Labels, answers: dict[str, dict[str, np.ndarray]], heads: list[Head]) -> LiveMetrics:
    """The live metrics of each head with a label column, on the rows joined to an answer."""
    frame = labels.frame
    in_window = frame[REQUEST_ID].isin(answers)
    live = LiveMetrics({}, len(frame), 0)
    if (~in_window).any():
        live.not_joined["request not logged in the window"] = int((~in_window).sum())
    joined = frame[in_window]
    scored_rows: set[int] = set()
    for head in heads:
        if head.label_column not in frame.columns:
            continue
        rows, predictions = [], []
        for position, (request_id, index) in enumerate(zip(joined[REQUEST_ID], joined[EXAMPLE_INDEX])):
            answer = answers[request_id].get(head.name)
            if answer is None or not 0 <= index < len(answer):
                reason = f"no {head.name} prediction in the answer" if answer is None else "example_index outside the request"
                live.not_joined[reason] = live.not_joined.get(reason, 0) + 1
                continue
            rows.append(position)
            predictions.append(answer[index])
        if rows:
            values = _label_values(joined[head.label_column].iloc[rows], head)
            measured = head_metrics([head], {head.name: np.stack(predictions)}, {head.name: values})
            live.metrics.update({k: v for k, v in measured.items() if k.startswith(f"{head.name}_")})
            scored_rows.update(rows)
    live.joined = len(scored_rows)
    return live
