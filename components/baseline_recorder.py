"""BaselineRecorder: after the Pusher, makes a pushed run's schema and statistics the baseline
the next runs' data is checked against (validation.baseline). A run that pushed nothing leaves
the baseline as it was."""

import logging

from tfx.dsl.component.experimental.annotations import InputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component
from tfx.types import artifact_utils
from tfx.types.standard_artifacts import Examples, ExampleStatistics, ModelBlessing, PushedModel, Schema

from components.eval_predictions import recorded_from, recorded_predictions
from components.splits import EVAL_SPLIT, split_pattern


@component
def BaselineRecorder(
    statistics: InputArtifact[ExampleStatistics],
    schema: InputArtifact[Schema],
    pushed_model: InputArtifact[PushedModel],
    baseline_dir: Parameter[str],
    examples: InputArtifact[Examples] = None,
    blessing: InputArtifact[ModelBlessing] = None,
) -> None:
    """With `examples`, the pushed model's predictions on the eval split go into the baseline too
    (split `eval_predictions`): `loopline monitor` compares served predictions with them. With
    `blessing`, the ones the Evaluator summarized are taken when it evaluated the pushed model."""
    from trainer.evaluation import is_loopline_export
    from trainer.predicted import EVAL_PREDICTIONS
    from validation.baseline import read_baseline, write_baseline
    from validation.schema import load_schema
    from validation.statistics import read_statistics

    log = logging.getLogger("loopline")
    if not pushed_model.has_custom_property("pushed") or pushed_model.get_int_custom_property("pushed") != 1:
        log.info("baseline unchanged: this run pushed no model")
        return
    splits = artifact_utils.decode_split_names(statistics.split_names)
    stats = {split: read_statistics(artifact_utils.get_split_uri([statistics], split)) for split in splits}
    version = pushed_model.get_string_custom_property("pushed_version")
    pushed_to = pushed_model.get_string_custom_property("pushed_destination")
    source = {"pushed_version": version, "pushed_model": pushed_model.uri, "statistics": statistics.uri,
              "schema": schema.uri}
    if examples is not None and is_loopline_export(pushed_to):
        recorded = recorded_predictions(blessing, pushed_to)  # the Evaluator's, when it evaluated this model
        if recorded is not None:
            stats[EVAL_PREDICTIONS], source[EVAL_PREDICTIONS] = recorded, recorded_from(blessing)
        else:
            stats[EVAL_PREDICTIONS] = _eval_predictions(pushed_to, split_pattern(examples, EVAL_SPLIT))
            source[EVAL_PREDICTIONS] = pushed_to
    previous = read_baseline(baseline_dir)  # raises if present but unreadable
    # The acceptance behind the baseline this run passed carries on (validation.baseline.cache_key).
    location = write_baseline(baseline_dir, load_schema(schema.uri), stats, source,
                              acceptance=previous.acceptance if previous is not None else "")
    log.info("baseline for the next runs: %s (pushed version %s)", location, version)


def _eval_predictions(saved_model_dir: str, eval_pattern: str):
    """Statistics of the pushed model's predictions on the eval split, called as the server calls it."""
    from serving.signature_call import signature_caller
    from trainer.predicted import EVAL_PREDICTIONS, eval_prediction_batches
    from validation.statistics import ExampleStatistics

    summary = ExampleStatistics()
    for batch in eval_prediction_batches(saved_model_dir, eval_pattern, signature_caller):
        summary.add_batch(batch)
    return summary.result(EVAL_PREDICTIONS)
