"""Compare a simulated run with a measured one, request by request."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tokenfair.results import ResultRecord


def compare_with_measured(
    simulated: Sequence[ResultRecord], measured: Sequence[ResultRecord], measured_makespan_s: float
) -> dict[str, float]:
    """Makespan error and the median / p90 absolute error of per-request TTFT and latency.

    Requests are matched by position (both come from the same trace, in trace order).
    Latency is measured from arrival to finish, like the reference file's `latency_s`.
    """
    if len(simulated) != len(measured):
        raise ValueError(f"{len(simulated)} simulated requests vs {len(measured)} measured")
    ttft_err, latency_err = [], []
    for sim, real in zip(simulated, measured, strict=True):
        if sim.first_token_s is None or sim.finish_s is None:
            continue
        if real.first_token_s is None or real.finish_s is None:
            continue
        ttft_err.append(
            abs((sim.first_token_s - sim.arrival_s) - (real.first_token_s - real.arrival_s))
        )
        latency_err.append(abs((sim.finish_s - sim.arrival_s) - (real.finish_s - real.arrival_s)))
    finishes = [r.finish_s for r in simulated if r.finish_s is not None]
    makespan = max(finishes) - min(r.arrival_s for r in simulated)
    real_ttft = [r.first_token_s - r.arrival_s for r in measured if r.first_token_s is not None]
    real_latency = [r.finish_s - r.arrival_s for r in measured if r.finish_s is not None]
    return {
        "makespan_s": makespan,
        "measured_makespan_s": measured_makespan_s,
        "makespan_error": makespan / measured_makespan_s - 1.0,
        "ttft_abs_error_median_s": float(np.median(ttft_err)),
        "ttft_abs_error_p90_s": float(np.percentile(ttft_err, 90)),
        "latency_abs_error_median_s": float(np.median(latency_err)),
        "latency_abs_error_p90_s": float(np.percentile(latency_err, 90)),
        "measured_ttft_median_s": float(np.median(real_ttft)),
        "simulated_ttft_median_s": float(
            np.median(
                [(r.first_token_s - r.arrival_s) for r in simulated if r.first_token_s is not None]
            )
        ),
        "measured_latency_median_s": float(np.median(real_latency)),
        "simulated_latency_median_s": float(
            np.median([(r.finish_s - r.arrival_s) for r in simulated if r.finish_s is not None])
        ),
    }
