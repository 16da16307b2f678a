"""The report's figures (matplotlib, Agg backend, PNG), shaped like the paper's.

Per workload:
- `<name>_service_rate.png`: service rate per client over time, one panel per featured
  policy (FCFS, VTC, weighted VTC where it ran) sharing the y axis;
- `<name>_response_time.png`: mean time to first token per client over time (by arrival);
- `<name>_service_difference.png`: what separates the policies: the accumulated service
  difference among the clients backlogged under every policy, with VTC's bound B, when
  there are two or more of them; else the windowed service difference D over time, one
  panel per policy against FCFS.
Plus `arena_table.png` (Max/Avg Diff and throughput beside the paper's) and
`ablation.png` (VTC's accumulated service difference per KV pool and request length).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI

import matplotlib.pyplot as plt
import numpy as np

from tokenfair.core.cost import DEFAULT_COST
from tokenfair.core.policies.registry import is_builtin
from tokenfair.experiments.ablation import BASE_KV_TOKENS, BASE_LENGTH
from tokenfair.experiments.experiment import ExperimentResult
from tokenfair.experiments.paper_table import PAPER_ARENA_TABLE, PAPER_LABEL
from tokenfair.experiments.runner import RunOutcome
from tokenfair.experiments.workloads import Workload
from tokenfair.fairness.bounds import difference_among, service_bound
from tokenfair.fairness.curves import (
    busiest_clients,
    natural_key,
    response_time_curves,
    service_difference_curve,
    service_rate_curves,
)

FIGURES_DIR = "figures"
DPI = 110
# Beyond this many clients the per-client panels show only the busiest ones: a legend
# of 27 entries is unreadable.
MAX_CLIENT_LINES = 8
FEATURED_POLICIES = ("fcfs", "vtc", "wvtc")
# Per-client panels side by side: up to this many policies, every one is shown.
MAX_PANELS = 4
SERVICE_UNIT = DEFAULT_COST.unit


@dataclass(frozen=True, slots=True)
class Figure:
    """A written figure: `path` is relative to the experiment's output folder."""

    path: str
    title: str
    caption: str
    workload: str


def featured_policies(outcomes: Sequence[RunOutcome]) -> list[RunOutcome]:
    """The runs the per-client panels show: every one, when a few policies ran (a
    comparison of one's own choosing); else FCFS vs (weighted) VTC, as in the paper, and
    every policy that is not built in (one's own, beside them)."""
    if len(outcomes) <= MAX_PANELS:
        return list(outcomes)
    chosen = [o for name in FEATURED_POLICIES for o in outcomes if o.policy == name]
    chosen += [o for o in outcomes if not is_builtin(o.policy)]
    return chosen or list(outcomes[:MAX_PANELS])


def _client_colors(clients: Sequence[str]) -> dict[str, tuple]:
    palette = plt.get_cmap("tab10")
    return {client: palette(i % 10) for i, client in enumerate(clients)}


def _shown_clients(workload: Workload, outcomes: Sequence[RunOutcome]) -> tuple[list[str], str]:
    clients = sorted(workload.clients, key=natural_key)
    if len(clients) <= MAX_CLIENT_LINES:
        return clients, ""
    shown = busiest_clients(outcomes[0].results, MAX_CLIENT_LINES)
    return shown, f" ({len(shown)} busiest of {len(clients)} clients)"


def _save(fig: plt.Figure, out_dir: Path, name: str) -> str:
    relative = f"{FIGURES_DIR}/{name}"
    (out_dir / FIGURES_DIR).mkdir(parents=True, exist_ok=True)
    fig.savefig(out_dir / relative, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return relative


def _client_label(workload: Workload, client: str) -> str:
    if workload.weights:
        return f"{client} (weight {workload.weights.get(client, 1.0):g})"
    return client


def _panels(count: int, title: str) -> tuple[plt.Figure, list[plt.Axes]]:
    fig, axes = plt.subplots(
        1, count, figsize=(5.2 * count, 3.8), sharey=True, squeeze=False, layout="constrained"
    )
    fig.suptitle(title, fontsize=12)
    return fig, list(axes[0])


def plot_service_rate(workload: Workload, outcomes: Sequence[RunOutcome], out_dir: Path) -> Figure:
    featured = featured_policies(outcomes)
    clients, note = _shown_clients(workload, outcomes)
    colors = _client_colors(clients)
    fig, axes = _panels(len(featured), f"{workload.name}: service rate per client{note}")
    for ax, outcome in zip(axes, featured, strict=True):
        times, curves = service_rate_curves(outcome.results, workload.duration_s, workload.window_s)
        for client in clients:
            if client in curves:
                ax.plot(
                    times,
                    curves[client],
                    color=colors[client],
                    label=_client_label(workload, client),
                )
        ax.set_title(outcome.label)
        ax.set_xlabel("time (s)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"service rate ({SERVICE_UNIT} / s)")
    axes[-1].legend(fontsize=8, loc="best")
    path = _save(fig, out_dir, f"{workload.name}_service_rate.png")
    caption = (
        f"Service each client receives per second, over a sliding {workload.window_s:g} s "
        f"window, under {', '.join(o.label for o in featured)}."
    )
    return Figure(path, f"{workload.name}: service rate", caption, workload.name)


def plot_response_time(workload: Workload, outcomes: Sequence[RunOutcome], out_dir: Path) -> Figure:
    featured = featured_policies(outcomes)
    clients, note = _shown_clients(workload, outcomes)
    colors = _client_colors(clients)
    fig, axes = _panels(len(featured), f"{workload.name}: response time per client{note}")
    positive: list[float] = []
    for ax, outcome in zip(axes, featured, strict=True):
        times, curves = response_time_curves(
            outcome.results, workload.duration_s, workload.window_s
        )
        for client in clients:
            if client in curves:
                ax.plot(
                    times,
                    curves[client],
                    color=colors[client],
                    marker=".",
                    markersize=3,
                    label=_client_label(workload, client),
                )
                values = curves[client]
                positive += values[np.isfinite(values) & (values > 0)].tolist()
        ax.set_title(outcome.label)
        ax.set_xlabel("arrival time (s)")
        ax.grid(alpha=0.3)
    # FCFS's queueing delays dwarf VTC's: a log axis keeps both readable.
    if positive and max(positive) / max(min(positive), 1e-3) > 50:
        axes[0].set_yscale("log")
    axes[0].set_ylabel("time to first token (s)")
    axes[-1].legend(fontsize=8, loc="best")
    path = _save(fig, out_dir, f"{workload.name}_response_time.png")
    caption = (
        "Mean time to first token of each client's requests, by arrival time "
        f"(bins of {max(workload.window_s / 4, workload.duration_s / 120):g} s)."
    )
    return Figure(path, f"{workload.name}: response time", caption, workload.name)


def _policy_style(policy: str) -> dict:
    # Rate limiters reject work, so their curves mean something else: draw them dashed.
    return {"linestyle": "--"} if policy.startswith("rpm") else {}


def common_backlogged(outcomes: Sequence[RunOutcome]) -> list[str]:
    """Clients backlogged (nearly) throughout under every policy, in natural order."""
    sets = [set(o.report.backlogged) for o in outcomes]
    return sorted(set.intersection(*sets), key=natural_key) if sets else []


def plot_service_difference(
    workload: Workload, outcomes: Sequence[RunOutcome], out_dir: Path
) -> Figure:
    """Like with like: the accumulated difference among the clients backlogged under
    every policy when there are two or more; otherwise (light clients get what they ask
    for under one policy and wait under another) the windowed service difference D over
    time, per policy, which is what the table's Max/Avg Diff summarise."""
    clients = common_backlogged(outcomes)
    if len(clients) >= 2:
        return _accumulated_difference_figure(workload, outcomes, clients, out_dir)
    return _windowed_difference_figure(workload, outcomes, out_dir)


def _accumulated_difference_figure(
    workload: Workload, outcomes: Sequence[RunOutcome], clients: list[str], out_dir: Path
) -> Figure:
    fig, ax = plt.subplots(figsize=(7.5, 4.2), layout="constrained")
    top = 0.0
    for outcome in outcomes:
        if set(outcome.report.backlogged) == set(clients):
            curve = outcome.report.accumulated_difference  # computed once per run
        else:
            curve = difference_among(
                outcome.results, clients, workload.duration_s, workload.warmup_s, workload.weights
            )
        ax.plot(
            curve.times,
            curve.values,
            label=outcome.label,
            linewidth=1.6,
            **_policy_style(outcome.policy),
        )
        top = max(top, curve.peak)
    bound = service_bound(workload.records, outcomes[0].job.config.kv_tokens)
    if bound <= 3 * top:  # a bound far above every curve would flatten them
        ax.axhline(bound, color="black", linestyle=":", label=f"VTC bound B = {bound:,.0f}")
    weighted = " / weight" if workload.weights else ""
    shown = ", ".join(clients) if len(clients) <= 4 else f"{len(clients)} clients"
    ax.set_title(f"{workload.name}: accumulated service difference among {shown}")
    ax.set_xlabel("time (s)")
    ax.set_ylabel(f"accumulated service difference ({SERVICE_UNIT}{weighted})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    path = _save(fig, out_dir, f"{workload.name}_service_difference.png")
    caption = (
        "Largest minus smallest service received since the end of warm-up "
        f"({workload.warmup_s:g} s) among the same clients under every policy: those "
        f"backlogged nearly throughout under all of them ({', '.join(clients)})."
    )
    return Figure(path, f"{workload.name}: accumulated service difference", caption, workload.name)


def _windowed_difference_figure(
    workload: Workload, outcomes: Sequence[RunOutcome], out_dir: Path
) -> Figure:
    curves = {
        o.policy: service_difference_curve(
            o.results, workload.duration_s, workload.window_s, workload.warmup_s, workload.weights
        )
        for o in outcomes
    }
    base = "fcfs" if "fcfs" in curves else outcomes[0].policy
    base_label = next(o.label for o in outcomes if o.policy == base)
    columns = min(3, len(outcomes))
    rows = -(-len(outcomes) // columns)
    fig, grid = plt.subplots(
        rows,
        columns,
        figsize=(4.4 * columns, 2.9 * rows),
        sharex=True,
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    axes = list(grid.flat)
    for ax, outcome in zip(axes, outcomes, strict=False):
        times, values = curves[outcome.policy]
        if outcome.policy != base:
            ax.plot(*curves[base], color="tab:gray", linewidth=1.0, alpha=0.7, label=base_label)
        ax.plot(
            times,
            values,
            color="tab:blue",
            linewidth=1.6,
            label=outcome.label,
            **_policy_style(outcome.policy),
        )
        report = outcome.report
        ax.set_title(
            f"{outcome.label}: Max {report.max_diff:,.0f}, Avg {report.avg_diff:,.0f}, "
            f"{report.throughput_tok_s:,.0f} tok/s",
            fontsize=9,
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    for ax in axes[len(outcomes) :]:
        ax.set_visible(False)
    for ax in grid[:, 0]:
        ax.set_ylabel(f"D ({SERVICE_UNIT} / s)", fontsize=8)
    for ax in grid[-1, :]:
        ax.set_xlabel("window centre (s)")
    fig.suptitle(
        f"{workload.name}: service difference D over time, each policy against {base_label}"
    )
    path = _save(fig, out_dir, f"{workload.name}_service_difference.png")
    caption = (
        f"The windowed service difference D of SPEC section 6 (w = {workload.window_s:g} s) "
        f"over time, one panel per policy with {base_label} in grey; the table's Max and Avg Diff "
        "are its maximum and mean at the 19 ticks. Fewer than two clients stay backlogged "
        "under every policy, so an accumulated difference would compare different clients."
    )
    return Figure(path, f"{workload.name}: service difference over time", caption, workload.name)


def plot_arena_table(outcomes: Sequence[RunOutcome], out_dir: Path) -> Figure:
    """Max/Avg Diff and throughput per scheduler, simulated beside the paper's."""
    policies = [o.policy for o in outcomes]
    x = np.arange(len(policies))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), layout="constrained")
    panels = (("max_diff", "Max Diff"), ("throughput_tok_s", "Throughput"))
    for ax, (key, label) in zip(axes, panels, strict=True):
        ours = [getattr(o.report, key) for o in outcomes]
        paper = [
            getattr(PAPER_ARENA_TABLE[p], key) if p in PAPER_ARENA_TABLE else np.nan
            for p in policies
        ]
        ax.bar(x - 0.2, ours, width=0.4, label="tokenfair (simulated A10G)")
        ax.bar(x + 0.2, paper, width=0.4, label=PAPER_LABEL, color="tab:gray")
        ax.set_xticks(x, [o.label for o in outcomes], rotation=30, ha="right")
        ax.set_ylabel(
            f"Max Diff ({SERVICE_UNIT} / s)" if key == "max_diff" else "throughput (tokens / s)"
        )
        ax.set_title(f"arena trace: {label}")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    path = _save(fig, out_dir, "arena_table.png")
    caption = "The real-trace table as bars: lower Max Diff is fairer; RPM buys it with throughput."
    return Figure(path, "arena: Max Diff and throughput vs the paper", caption, "arena")


def plot_ablation(outcomes: Sequence[RunOutcome], out_dir: Path) -> Figure:
    """VTC's accumulated service difference over time per KV pool and request length,
    and below it that of every policy of one's own that ran the ablation."""
    shown = ["vtc", *dict.fromkeys(o.policy for o in outcomes if not is_builtin(o.policy))]
    fig, grid = plt.subplots(
        len(shown), 2, figsize=(12, 4.2 * len(shown)), squeeze=False, layout="constrained"
    )
    for axes, policy in zip(grid, shown, strict=True):
        _ablation_row(axes, [o for o in outcomes if o.policy == policy])
    path = _save(fig, out_dir, "ablation.png")
    caption = (
        "Two backlogged clients (3 and 6 req/s at 256/256 tokens, x 256/length for longer "
        "requests); left: 256/256-token requests with a "
        f"10k/35k/65k-token pool; right: {BASE_KV_TOKENS:,}-token pool, 256/512/768 tokens."
    )
    return Figure(path, "ablation: KV pool size and request length", caption, "ablation")


def _ablation_row(axes: Sequence[plt.Axes], runs: Sequence[RunOutcome]) -> None:
    """One policy's accumulated difference, against the pool (left) and the length."""
    sweeps = (
        (axes[0], lambda o: o.workload.records[0].input_tokens == BASE_LENGTH, "KV pool"),
        (axes[1], lambda o: o.job.config.kv_tokens == BASE_KV_TOKENS, "request length"),
    )
    name = "VTC" if runs and runs[0].policy == "vtc" else (runs[0].label if runs else "")
    for ax, keep, factor in sweeps:
        for outcome in sorted(
            filter(keep, runs), key=lambda o: (o.job.config.kv_tokens, o.workload.name)
        ):
            kv, length = outcome.job.config.kv_tokens, outcome.workload.records[0].input_tokens
            label = f"pool {kv:,} tokens" if factor == "KV pool" else f"{length}/{length} tokens"
            curve = outcome.report.accumulated_difference
            ax.plot(curve.times, curve.values, label=label, linewidth=1.6)
        ax.set_title(f"{name}: accumulated service difference vs {factor}")
        ax.set_xlabel("time (s)")
        ax.set_ylabel(f"accumulated service difference ({SERVICE_UNIT})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)


def experiment_figures(result: ExperimentResult) -> list[Figure]:
    """Every figure of an experiment, in report order."""
    figures = []
    out_dir = result.out_dir
    arena = result.outcomes_for("arena")
    if arena:
        figures.append(plot_arena_table(arena, out_dir))
    for workload in result.workloads:
        outcomes = result.outcomes_for(workload.name)
        if not outcomes:
            continue
        figures += plot_workload(workload, outcomes, out_dir)
    if result.ablation_outcomes:
        figures.append(plot_ablation(result.ablation_outcomes, out_dir))
    return figures


def plot_workload(
    workload: Workload, outcomes: Sequence[RunOutcome], out_dir: Path
) -> list[Figure]:
    """A workload's figures under its policies: service rate and response time per
    client, and the service difference."""
    return [
        plot_service_rate(workload, outcomes, out_dir),
        plot_response_time(workload, outcomes, out_dir),
        plot_service_difference(workload, outcomes, out_dir),
    ]
