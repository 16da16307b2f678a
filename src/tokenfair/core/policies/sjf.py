"""Shortest (predicted) job first, with an aging guard.

A request's key is its predicted output length minus `aging` tokens for every second
it has waited. Every waiting request ages at the same rate, so the order is fixed at
arrival: key = predicted + aging * arrival_s. A request predicted at P tokens is
therefore overtaken only by requests that arrive within P / aging seconds after it:
its wait is bounded no matter how many short requests keep coming.

The prediction is the request's own hint when it carries one, else the moving average
of its client's recent output lengths (its max_tokens before any history exists).
"""

from __future__ import annotations

from tokenfair.core.policies.base import KeyedPolicy
from tokenfair.core.policies.declaration import Argument, Declared, Needs
from tokenfair.core.policies.predictor import OutputLengthPredictor
from tokenfair.core.policies.view import RequestView


class SJFPolicy(KeyedPolicy):
    name = "sjf"

    def __init__(self, aging: float = 10.0, predictor: OutputLengthPredictor | None = None):
        super().__init__()
        if aging <= 0:
            raise ValueError(f"sjf aging must be > 0 tokens per second, got {aging}")
        self.aging = aging
        self.predictor = predictor or OutputLengthPredictor()

    def sort_key(self, request: RequestView, band: int) -> tuple:
        aged = self.predictor.predict(request) + self.aging * request.arrival_s
        return (band, aged, request.arrival_s)

    def on_finish(self, request: RequestView) -> None:
        self.predictor.observe(request)


DECLARED = [
    Declared(
        "sjf",
        "shortest predicted output first; waiting ages `aging` tokens/s (default 10)",
        lambda settings, aging: SJFPolicy(aging=aging),
        argument=Argument("aging", 10.0),
        needs=Needs(per_replica=True),
    )
]
