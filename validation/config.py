"""The `validation:` configuration section."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ValidationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    warn_only: bool = Field(False, description="Report anomalies but let training go on (default: stop the pipeline "
                                               "before the Trainer).")
    max_missing_fraction: float = Field(
        0.5, ge=0.0, le=1.0, description="A feature missing in more than this fraction of a split's examples is an "
        "anomaly: inferred schemas get `presence.min_fraction = 1 - max_missing_fraction`, except for a feature already "
        "below that in the split the schema is inferred from (no fraction floor, as TFDV).")
    max_domain_size: int = Field(100, ge=1, description="String features with at most this many distinct values get a "
                                                        "domain (their categories).")
    min_domain_mass: float = Field(1.0, ge=0.0, le=1.0, description="The fraction of a split's values that must be in "
                                                                    "the domain (TFDV's min_domain_mass).")
    numeric_text_fraction: float = Field(
        0.9, gt=0.0, le=1.0, description="A string feature whose values are at least this fraction numbers is a numeric "
        "column holding text (a typo such as \"n/a\" or \"12,5\" in one row of a CSV).")
    infer_ranges: bool = Field(
        False, description="Infer [min, max] ranges for numbers from the training split (off: sampling makes eval values "
        "just outside the train range common; a curated schema sets ranges on purpose).")
    max_linf_distance: float = Field(
        0.25, ge=0.0, le=1.0, description="Train/eval skew: an L-infinity distance of a categorical feature's value "
        "frequencies above this is an anomaly.")
    max_js_divergence: float = Field(
        0.25, ge=0.0, le=1.0, description="Train/eval skew: a Jensen-Shannon divergence (base 2) of a numeric feature's "
        "histograms above this is an anomaly.")
    max_linf_drift: float = Field(
        0.25, ge=0.0, le=1.0, description="Drift between runs, each split against the same split of the baseline (the "
        "last run whose model was pushed, or accepted data): an L-infinity distance of category frequencies above this "
        "is an anomaly, unless the schema's drift_comparator sets the feature's own threshold.")
    max_js_drift: float = Field(
        0.25, ge=0.0, le=1.0, description="Drift between runs, as max_linf_drift: a Jensen-Shannon divergence of numeric "
        "histograms above this is an anomaly, unless the schema's drift_comparator sets the feature's own threshold.")
    accept_changes: bool = Field(
        False, description="Accept, for this run, the changes found against the baseline (schema changes, drift): the "
        "run trains on the new data; problems within the run still stop it.")
    unseen_label_classes: Literal["warn", "stop"] = Field(
        "warn", description="Classes of a classification label in the eval split that the train split lacks: warn "
        "reports them (the run goes on; the trainer counts them as <head>_unseen_label_examples), stop makes them an "
        "anomaly that stops the run.")
    example_values: int = Field(5, ge=1, description="Example values quoted per problem in reports.")
