"""The trainer's configuration: the `trainer:` section of loopline.yaml."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TrainerConfig(BaseModel):
    """Every key is optional; the defaults train the bundled data as they are."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    module_file: str | None = Field(
        None, description="User model module (build_model, heads...); null builds a generic tabular model."
    )
    epochs: int = Field(20, ge=1)
    max_steps: int | None = Field(None, ge=1, description="Stop after this many optimizer steps.")
    batch_size: int = Field(32, ge=1)
    learning_rate: float = Field(0.01, gt=0)
    seed: int = 42
