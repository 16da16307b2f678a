"""Output-length predictors for sjf and VTC with length prediction."""

from __future__ import annotations

from collections import deque

from tokenfair.core.policies.view import RequestView
from tokenfair.core.request import FinishReason


class OutputLengthPredictor:
    """Per-client moving average of the last `window` finished output lengths.

    A request's own `predicted_output_tokens` hint wins. Before a client has any
    history the prediction is `default` (capped by the request's max_tokens).
    """

    def __init__(self, window: int = 5, default: int = 256):
        self.window = window
        self.default = default
        self._history: dict[str, deque[int]] = {}
        self._sum: dict[str, int] = {}

    def predict(self, request: RequestView) -> int:
        if request.predicted_output_tokens is not None:
            return min(request.predicted_output_tokens, request.max_tokens)
        history = self._history.get(request.client)
        guess = round(self._sum[request.client] / len(history)) if history else self.default
        return max(1, min(guess, request.max_tokens))

    def observe(self, request: RequestView) -> None:
        if request.finish_reason not in (FinishReason.STOP, FinishReason.LENGTH):
            return  # an aborted request says nothing about its natural length
        history = self._history.setdefault(request.client, deque())
        history.append(request.num_output_tokens)
        self._sum[request.client] = self._sum.get(request.client, 0) + request.num_output_tokens
        if len(history) > self.window:
            self._sum[request.client] -= history.popleft()


class OraclePredictor(OutputLengthPredictor):
    """The true output length (the simulator knows it): for experiments only."""

    def predict(self, request: RequestView) -> int:
        if request.target_output_tokens is not None:
            return min(request.target_output_tokens, request.max_tokens)
        return super().predict(request)
