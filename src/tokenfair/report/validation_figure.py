"""The simulator against the measured A10G run: per-request TTFT, simulated vs measured.

`arena_ttft_validation.png`: left, each request's simulated TTFT against its measured
TTFT (FCFS on the arena trace, the paper preset; the diagonal is perfect agreement);
right, the two TTFT distributions as CDFs. The measured run
(`shared/reference/a10g_llama7b_fcfs_arena_measured.jsonl`) is what the simulator's
per-step overhead was calibrated on (docs/simulator.md), on decode windows only, so
TTFT is a check, not a fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI

import matplotlib.pyplot as plt
import numpy as np

from tokenfair.engine.sim.validation import compare_with_measured
from tokenfair.experiments.experiment import ExperimentResult
from tokenfair.report.figures import Figure, _save
from tokenfair.results import ResultRecord

MEASURED_MAKESPAN_S = 757.7  # SPEC section 8


def _ttft_pairs(
    simulated: Sequence[ResultRecord], measured: Sequence[ResultRecord]
) -> tuple[np.ndarray, np.ndarray]:
    pairs = [
        (s.first_token_s - s.arrival_s, m.first_token_s - m.arrival_s)
        for s, m in zip(simulated, measured, strict=True)
        if s.first_token_s is not None and m.first_token_s is not None
    ]
    array = np.array(pairs, dtype=float).reshape(-1, 2)
    return array[:, 0], array[:, 1]


def plot_ttft_validation(
    simulated: Sequence[ResultRecord], measured: Sequence[ResultRecord], out_dir: Path
) -> Figure:
    """Simulated vs measured TTFT per request (FCFS, arena) and their distributions."""
    figures = compare_with_measured(simulated, measured, MEASURED_MAKESPAN_S)
    sim, real = _ttft_pairs(simulated, measured)
    fig, (scatter, cdf) = plt.subplots(1, 2, figsize=(10.4, 4.2), layout="constrained")
    fig.suptitle("Arena trace under FCFS: simulated vs measured time to first token")
    top = float(max(sim.max(initial=1.0), real.max(initial=1.0))) * 1.05
    scatter.plot([0, top], [0, top], color="0.6", linewidth=1, label="equal")
    scatter.scatter(real, sim, s=6, alpha=0.5, color="tab:blue", label="one request")
    scatter.set(
        xlabel="measured TTFT (s)", ylabel="simulated TTFT (s)", xlim=(0, top), ylim=(0, top)
    )
    scatter.legend(loc="upper left", fontsize=8)
    for values, label, color in (
        (real, "measured (A10G)", "black"),
        (sim, "simulated", "tab:blue"),
    ):
        ordered = np.sort(values)
        cdf.plot(
            ordered, np.arange(1, len(ordered) + 1) / max(len(ordered), 1), label=label, color=color
        )
    cdf.set(xlabel="TTFT (s)", ylabel="fraction of requests")
    cdf.legend(loc="lower right", fontsize=8)
    path = _save(fig, out_dir, "arena_ttft_validation.png")
    caption = (
        f"FCFS on the arena trace, paper preset. Median TTFT {figures['simulated_ttft_median_s']:.1f} s "
        f"simulated vs {figures['measured_ttft_median_s']:.1f} s measured; per-request absolute "
        f"error median {figures['ttft_abs_error_median_s']:.2f} s, p90 "
        f"{figures['ttft_abs_error_p90_s']:.2f} s; makespan {figures['makespan_s']:.1f} s vs "
        f"{MEASURED_MAKESPAN_S} s. The simulator's step overhead was calibrated on this run's "
        "decode windows, not on TTFT."
    )
    return Figure(path, "arena: simulated vs measured TTFT", caption, "arena")


def validation_figures(result: ExperimentResult) -> list[Figure]:
    """The TTFT figure, when the run has the arena under FCFS and the measured run."""
    fcfs = [o for o in result.outcomes_for("arena") if o.job.policy == "fcfs"]
    measured = result.measured_fcfs_arena
    if not fcfs or len(measured) != len(fcfs[0].results):
        return []
    return [plot_ttft_validation(fcfs[0].results, measured, result.out_dir)]
