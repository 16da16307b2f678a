"""The any-mix figure: each light tenant's TTFT p99 against its alone figure, by how
much of its weighted share it asks for (experiments/mixes.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

from tokenfair.experiments.mixes import LightRow
from tokenfair.report.figures import DPI

MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _plain(value: float, _: object) -> str:
    return f"{value:g}"


def _twos_and_fives(value: float, _: object) -> str:
    return f"{value:g}" if f"{value:.0e}"[0] in "25" else ""


def plot_any_mix(lights: Sequence[LightRow], path: Path) -> None:
    """One panel per profile: every light tenant of every mix, its TTFT p99 ÷ alone
    (log) against its demand ÷ its weighted share (log), one marker per run; the
    2x line and the share (1) drawn."""
    profiles = list(dict.fromkeys(row.profile for row in lights))
    runs = list(dict.fromkeys(label for row in lights for label in row.runs))
    fig, axes = plt.subplots(
        1, max(1, len(profiles)), figsize=(6 * max(1, len(profiles)), 4.5), squeeze=False
    )
    for ax, profile in zip(axes[0], profiles, strict=False):
        mine = [row for row in lights if row.profile == profile]
        for index, label in enumerate(runs):
            points = [
                (row.demand_share, row.runs[label].ttft_p99_x_alone)
                for row in mine
                if label in row.runs and row.runs[label].ttft_p99_x_alone
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.scatter(
                    xs, ys, s=18, alpha=0.7, marker=MARKERS[index % len(MARKERS)], label=label
                )
        ax.axhline(2.0, color="red", ls="--", lw=1, label="2x alone")
        ax.axvline(1.0, color="grey", ls=":", lw=1, label="its weighted share")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(_plain))
        ax.xaxis.set_minor_formatter(FuncFormatter(_twos_and_fives))
        ax.yaxis.set_major_formatter(FuncFormatter(_plain))
        ax.set_xlabel("demand ÷ weighted share (of what fcfs served)")
        ax.set_ylabel("light tenant's TTFT p99 ÷ alone")
        seeds = len({row.seed for row in mine})
        ax.set_title(f"{profile}: {len(mine)} light tenants of {seeds} mixes")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
