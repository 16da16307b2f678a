"""The admin API's body for changing a tenant's or a group's weight at run time."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class WeightChange(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    weight: float = Field(gt=0, le=1e9, allow_inf_nan=False)
