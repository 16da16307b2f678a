"""Compare a simulated run with a measured one, request by request."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tokenfair.results import ResultRecord


def _ttft(record: ResultRecord) -> float | None:
    if record.first_token_s is None:
        return None
    return record.first_token_s - record.arrival_s


def _latency(record: ResultRecord) -> float | None:
    if record.first_token_s is None or record.finish_s is None:
        return None  # never served: no latency to compare
    return record.finish_s - record.arrival_s


def _error_figures(name: str, pairs: list[tuple[float, float]]) -> dict[str, float]:
    """Median / p90 of |sim - real| (seconds) and of |sim - real| / real."""
    if not pairs:
        return {}
    sim = np.array([p[0] for p in pairs])
    real = np.array([p[1] for p in pairs])
    absolute = np.abs(sim - real)
    # A measured time of zero has no relative error to speak of: leave it out.
    positive = real > 0
    relative = absolute[positive] / real[positive]
    figures = {
        f"{name}_abs_error_median_s": float(np.median(absolute)),
        f"{name}_abs_error_p90_s": float(np.percentile(absolute, 90)),
        f"measured_{name}_median_s": float(np.median(real)),
        f"simulated_{name}_median_s": float(np.median(sim)),
    }
    if relative.size:
        figures[f"{name}_rel_error_median"] = float(np.median(relative))
        figures[f"{name}_rel_error_p90"] = float(np.percentile(relative, 90))
    return figures


def compare_with_measured(
    simulated: Sequence[ResultRecord], measured: Sequence[ResultRecord], measured_makespan_s: float
) -> dict[str, float]:
    """Makespan error and the median / p90 absolute and relative error of per-request
    TTFT and latency.

    Requests are matched by position (both come from the same trace, in trace order).
    Latency is measured from arrival to finish, like the reference file's `latency_s`.
    A request that either side never served (no first token) is left out of the
    per-request figures and counted in `unmatched_requests`.
    """
    if len(simulated) != len(measured):
        raise ValueError(f"{len(simulated)} simulated requests vs {len(measured)} measured")
    ttft_pairs: list[tuple[float, float]] = []
    latency_pairs: list[tuple[float, float]] = []
    unmatched = 0
    for sim, real in zip(simulated, measured, strict=True):
        sim_ttft, real_ttft = _ttft(sim), _ttft(real)
        sim_latency, real_latency = _latency(sim), _latency(real)
        if sim_ttft is None or real_ttft is None or sim_latency is None or real_latency is None:
            unmatched += 1
            continue
        ttft_pairs.append((sim_ttft, real_ttft))
        latency_pairs.append((sim_latency, real_latency))
    finishes = [r.finish_s for r in simulated if r.finish_s is not None]
    makespan = (max(finishes) - min(r.arrival_s for r in simulated)) if finishes else 0.0
    report: dict[str, float] = {
        "makespan_s": makespan,
        "measured_makespan_s": measured_makespan_s,
        "makespan_error": makespan / measured_makespan_s - 1.0,
        "matched_requests": float(len(ttft_pairs)),
        "unmatched_requests": float(unmatched),
    }
    report.update(_error_figures("ttft", ttft_pairs))
    report.update(_error_figures("latency", latency_pairs))
    return report
