"""Per-slice metrics in MLflow: each slice's candidate metrics from the Evaluator's slices.json,
logged as `slice/<slice>/<metric>`.

MLflow metric names may hold only letters, digits, `_ - . / :` and spaces, and must not change
under path normalization (mlflow/utils/validation.py). Slice names hold `=` and `,`
(`island=Biscoe,sex=male`), so they are written:

- `=` as `:`, and `,` as a space: `slice/island:Biscoe sex:male/species_accuracy`;
- any other character MLflow refuses (and `/`, which would add a level) as `_`;
- a part made of dots only (`.`, `..`) as underscores.

(MLflow refuses `:` in names on Windows clients; the pipeline runs on Linux.)"""
from __future__ import annotations

import logging
import re
import time

log = logging.getLogger("loopline.tracking")

PREFIX = "slice"
MAX_NAME = 250  # MLflow's limit on a metric key
_REFUSED = re.compile(r"[^\w.\- :]")


def metric_slice_name(slice_name: str) -> str:
    """`island=Biscoe,sex=male` -> `island:Biscoe sex:male` (see the module's notes)."""
    text = _REFUSED.sub("_", slice_name.replace("=", ":").replace(",", " ").replace("/", "_"))
    text = text.strip() or "_"
    return "_" * len(text) if set(text) == {"."} else text


def slice_metrics(slices: dict) -> dict[str, float]:
    """{`slice/<slice>/<metric>`: value} of the candidate's numeric metrics per slice; a name
    MLflow could not take whole (too long, or two slices writing one name) is left out and said."""
    out: dict[str, float] = {}
    for entry in slices.get("slices", []):
        part = metric_slice_name(str(entry.get("slice", "")))
        for metric, value in sorted((entry.get("candidate") or {}).items()):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            name = f"{PREFIX}/{part}/{metric_slice_name(str(metric))}"
            if len(name) > MAX_NAME or name in out:
                log.warning("MLflow: slice metric %r of slice %r not logged (%s)", metric, entry.get("slice"),
                            "name too long" if len(name) > MAX_NAME else f"another slice also maps to {name}")
                continue
            out[name] = float(value)
    return out


def log_slice_metrics(client, run_id: str, slices: dict) -> int:
    """Logs them into the run; returns how many."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, 0) for k, v in slice_metrics(slices).items()]
    for start in range(0, len(metrics), 1000):  # MLflow's batch limit
        client.log_batch(run_id, metrics=metrics[start:start + 1000])
    return len(metrics)
