"""The serving configuration: the `serving:` section of loopline.yaml."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ServingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    model_name: str = Field("penguins", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    host: str = "127.0.0.1"
    grpc_port: int = Field(8500, ge=0, le=65535)
    rest_port: int = Field(8501, ge=0, le=65535)
