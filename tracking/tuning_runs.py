"""The Tuner's side of tracking: one MLflow run for the search and one nested run per trial (its
values as parameters, its objective and metrics as metrics). The Trainer's run, the pipeline run's,
becomes the search run's parent once it exists (`adopt`). Nothing here raises into the pipeline."""
from __future__ import annotations

import logging

from tracking.target import TrackingTarget, ensure_experiment, make_client

log = logging.getLogger("loopline.tracking")

PARENT_TAG = "mlflow.parentRunId"  # how MLflow nests a run under another
TUNER_RUN_TAG = "loopline.tuner_run_id"


def log_search(target_json: str, trials: list[dict], params: dict, best: dict, tags: dict[str, str]) -> str:
    """The search run and its trials' nested runs; returns the search run's id ('' when tracking
    is off or failed). `trials`: trainer.tuning.trial_records; `best`: the best values."""
    if not target_json:
        return ""
    from mlflow.entities import Metric, Param

    try:
        target = TrackingTarget.from_json(target_json)
        client = make_client(target)
        experiment_id = ensure_experiment(client, target)
        parent = client.create_run(experiment_id, tags=tags, run_name="tuner").info.run_id
        client.log_batch(parent, params=[Param(k, str(v)[:6000]) for k, v in params.items()],
                         metrics=[Metric(f"best.{k}", float(v), 0, 0) for k, v in best.items()
                                  if isinstance(v, (int, float)) and not isinstance(v, bool)])
        for trial in trials:
            child = client.create_run(experiment_id, tags={**tags, PARENT_TAG: parent},
                                      run_name=f"trial-{trial['trial_id']}").info.run_id
            metrics = {**trial["metrics"], **({"score": trial["score"]} if trial["score"] is not None else {}),
                       **({"trial_seconds": trial["seconds"]} if trial["seconds"] is not None else {})}
            client.log_batch(child, params=[Param(k, str(v)) for k, v in trial["values"].items()],
                             metrics=[Metric(k, float(v), 0, 0) for k, v in metrics.items()])
            client.set_terminated(child, "FINISHED" if trial["status"].endswith("COMPLETED") else "FAILED")
        client.set_terminated(parent, "FINISHED")
        return parent
    except Exception as exc:  # noqa: BLE001 - tracking never stops the pipeline
        log.error("MLflow: could not log the search's trials: %s", exc)
        return ""


def adopt(target_json: str, search_run_id: str, training_run_id: str) -> None:
    """Nests the search run under the training run (the pipeline run's), unless it has a parent
    already (a Tuner whose output the cache reused)."""
    if not (target_json and search_run_id and training_run_id):
        return
    try:
        client = make_client(TrackingTarget.from_json(target_json))
        if PARENT_TAG not in client.get_run(search_run_id).data.tags:
            client.set_tag(search_run_id, PARENT_TAG, training_run_id)
        client.set_tag(training_run_id, TUNER_RUN_TAG, search_run_id)
    except Exception as exc:  # noqa: BLE001
        log.error("MLflow: could not nest the search run %s under %s: %s", search_run_id, training_run_id, exc)
