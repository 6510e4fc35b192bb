"""The `validation:` configuration section."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ValidationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # Report anomalies but let training go on (default: stop the pipeline before the Trainer).
    warn_only: bool = False
    # A feature missing in more than this fraction of a split's examples is an anomaly
    # (inferred schemas get `presence.min_fraction = 1 - max_missing_fraction`, except for a feature
    # already below that in the split the schema is inferred from: no fraction floor, as TFDV).
    max_missing_fraction: float = Field(0.5, ge=0.0, le=1.0)
    # String features with at most this many distinct values get a domain (their categories).
    max_domain_size: int = Field(100, ge=1)
    # The fraction of a split's values that must be in the domain (TFDV's min_domain_mass).
    min_domain_mass: float = Field(1.0, ge=0.0, le=1.0)
    # A string feature whose values are at least this fraction numbers is a numeric column
    # holding text (a typo such as "n/a" or "12,5" in one row of a CSV).
    numeric_text_fraction: float = Field(0.9, gt=0.0, le=1.0)
    # Infer [min, max] ranges for numbers from the training split (off: sampling makes eval
    # values just outside the train range common; a curated schema sets ranges on purpose).
    infer_ranges: bool = False
    # Train/eval skew: L-infinity distance of category frequencies and Jensen-Shannon
    # divergence (base 2) of numeric histograms above these thresholds are anomalies.
    max_linf_distance: float = Field(0.25, ge=0.0, le=1.0)
    max_js_divergence: float = Field(0.25, ge=0.0, le=1.0)
    # Drift between runs: each split against the same split of the baseline (the last run whose
    # model was pushed, or accepted data). L-infinity distance of category frequencies and
    # Jensen-Shannon divergence of numeric histograms above these are anomalies, unless the
    # schema's `drift_comparator` sets a feature's own threshold. Distinct from the skew keys.
    max_linf_drift: float = Field(0.25, ge=0.0, le=1.0)
    max_js_drift: float = Field(0.25, ge=0.0, le=1.0)
    # Accept, for this run, the changes found against the baseline (schema changes, drift):
    # the run trains on the new data; problems within the run still stop it.
    accept_changes: bool = False
    # Classes of a classification label in the eval split that the train split lacks: "warn"
    # reports them (the run goes on; the trainer counts them as <head>_unseen_label_examples),
    # "stop" makes them an anomaly that stops the run.
    unseen_label_classes: Literal["warn", "stop"] = "warn"
    # Example values quoted per problem in reports.
    example_values: int = Field(5, ge=1)
