"""The `export:` section of loopline.yaml."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trainer.config import Section

TFLiteVariant = Literal["float32", "dynamic_range", "float16", "int8"]

# Max abs output difference (probabilities; regression outputs in label standard deviations)
# and max metric delta (accuracy; RMSE in label standard deviations) a variant may show.
# Full-integer int8 can move single borderline probabilities a lot (0.3 seen on penguins)
# without changing the predicted classes; its metric delta is the tighter gate.
# dynamic_range: the largest output difference the scale bench saw over four training seeds at
# 1M rows (0.115; bench/results/scale.json `tflite_parity_by_seed`) times 1.5, rounded up. float32
# keeps a float-rounding floor (the bench saw 2.4e-6); float16 and int8 are not in the default
# variants, so the bench does not measure them: their figures come from the penguins tests.
DEFAULT_OUTPUT_TOLERANCE = {"float32": 1e-4, "dynamic_range": 0.18, "float16": 0.05, "int8": 0.5}
DEFAULT_METRIC_TOLERANCE = {"float32": 1e-6, "dynamic_range": 0.02, "float16": 0.01, "int8": 0.03}


class ExportConfig(Section):
    """What the Trainer writes besides the SavedModel."""

    tflite_variants: list[TFLiteVariant] = Field(
        default_factory=lambda: ["float32", "dynamic_range"],
        description="TFLite files converted from the predict_raw signature; [] for none.",
    )
    output_tolerance: dict[TFLiteVariant, float] = Field(
        default_factory=lambda: dict(DEFAULT_OUTPUT_TOLERANCE),
        description="Per variant: the largest absolute output difference from the SavedModel on the parity examples "
                    "(probabilities; regression outputs in label standard deviations). Variants left out keep their "
                    "defaults.",
    )
    metric_tolerance: dict[TFLiteVariant, float] = Field(
        default_factory=lambda: dict(DEFAULT_METRIC_TOLERANCE),
        description="Per variant: the largest metric difference from the SavedModel (accuracy; regression: RMSE in "
                    "label standard deviations). Variants left out keep their defaults.",
    )
    required_variants: list[TFLiteVariant] = Field(
        default_factory=lambda: ["float32"],
        description="Variants whose parity failure fails the run; any other variant that fails is dropped (its file "
                    "removed, the miss reported).",
    )
    parity_examples: int = Field(1000, ge=1, description="Eval-split examples the parity check runs on (at most).")
    representative_examples: int = Field(200, ge=1, description="Train-split examples calibrating int8.")
    warmup_examples: int = Field(8, ge=1, description="Eval examples per warmup request.")
    latency_runs: int = Field(50, ge=1, description="Single-example invocations timed per variant.")

    @model_validator(mode="after")
    def _fill_tolerances(self):
        # A partial tolerance mapping in the YAML keeps the defaults of the variants it omits.
        for name, defaults in (("output_tolerance", DEFAULT_OUTPUT_TOLERANCE), ("metric_tolerance", DEFAULT_METRIC_TOLERANCE)):
            current = getattr(self, name)
            if set(current) != set(defaults):
                object.__setattr__(self, name, {**defaults, **current})
        return self
