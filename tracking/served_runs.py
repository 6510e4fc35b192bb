"""What happens after the push, in MLflow: the run that trained a served version (found through
the registered version's `loopline.serving_version` tag), metrics of served traffic logged into
it at the time of the window they describe, and a run for a batch inference."""
from __future__ import annotations

from mlflow.entities import Metric

from tracking.registration import TAG_SERVING_VERSION

TAG_KIND = "loopline.kind"  # "infer" for `loopline infer` runs
TAG_MODEL_RUN = "loopline.model_run_id"  # the run of the model a batch inference used


def run_of_serving_version(client, registered_model: str, version: int | str) -> tuple[str | None, str | None]:
    """(run id, registered version) of the served version, (None, None) when none is registered."""
    for found in client.search_model_versions(f"name = '{registered_model}'"):
        if found.tags.get(TAG_SERVING_VERSION) == str(version):
            return found.run_id, str(found.version)
    return None, None


def log_metrics_at(client, run_id: str, metrics: dict[str, float], timestamp_s: float) -> None:
    """Logs `metrics` with the given time (ms) and its whole seconds as the step, so successive
    windows line up in time order on either axis of MLflow's charts."""
    at = [Metric(key, float(value), int(timestamp_s * 1000), int(timestamp_s)) for key, value in sorted(metrics.items())]
    for start in range(0, len(at), 500):  # MLflow's batch limit is 1000 metrics
        client.log_batch(run_id, metrics=at[start:start + 500])


def eval_metrics(client, run_id: str, prefix: str = "final_eval/") -> dict[str, float]:
    """The evaluation metrics the Trainer logged into the run (`final_eval/<name>`), by name."""
    return {k[len(prefix):]: v for k, v in client.get_run(run_id).data.metrics.items() if k.startswith(prefix)}
