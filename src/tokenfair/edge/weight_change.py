"""The admin API's body for changing a tenant's or a group's weight at run time."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from tokenfair.share_groups import Weight


class WeightChange(BaseModel):
    # strict: `{"weight": true}` or `{"weight": "2"}` is refused, not read as a number;
    # the range is every weight's (core/weights.py), as in the tenants file.
    model_config = ConfigDict(extra="forbid", strict=True)
    weight: Weight
