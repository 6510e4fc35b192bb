"""The `export:` and `evaluator:` sections: defaults, overrides, errors naming the key."""
import pytest

from pipeline.config import ConfigError, load_config
from trainer.export_config import DEFAULT_METRIC_TOLERANCE, DEFAULT_OUTPUT_TOLERANCE


def test_defaults_export_float32_and_dynamic_range():
    config = load_config(None)
    assert config.export.tflite_variants == ["float32", "dynamic_range"]
    assert config.export.output_tolerance == DEFAULT_OUTPUT_TOLERANCE
    assert config.evaluator.regression_metrics == ["loss"]


def test_overrides_keep_the_other_tolerances():
    config = load_config(None, ["export.tflite_variants=[int8, float16]", "export.output_tolerance.int8=0.2",
                                "evaluator.thresholds.species_accuracy.min=0.9"])
    assert config.export.tflite_variants == ["int8", "float16"]
    assert config.export.output_tolerance == {**DEFAULT_OUTPUT_TOLERANCE, "int8": 0.2}
    assert config.export.metric_tolerance == DEFAULT_METRIC_TOLERANCE
    assert config.evaluator.thresholds["species_accuracy"].min == 0.9


@pytest.mark.parametrize("override, key", [
    ("export.tflite_variants=[int4]", "export.tflite_variants.0"),
    ("export.output_tolerance.bf16=0.1", "export.output_tolerance.bf16"),
    ("evaluator.thresholds.loss.below=1", "evaluator.thresholds.loss.below"),
    ("evaluator.relative_tolerance=-1", "evaluator.relative_tolerance"),
])
def test_bad_keys_are_named(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])
