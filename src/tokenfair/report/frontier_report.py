"""The fairness-efficiency frontier's figure, tables and report (benchmarks/frontier.py).

`plot_frontier` draws, for each workload variant, one point per policy and pool: x is
throughput over VTC's, y is Max Diff per unit of throughput over VTC's (log scale where the range is wide), so
VTC sits at (1, 1), better is right and down. The `dlpm` quanta of one pool are joined
in order of their quantum: the curve the quantum moves along. `write_frontier_report`
writes OUT/report.md and OUT/report.html with the figure and a table per variant, from
the sweep's cells (live, or read back from its JSON lines).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI

import matplotlib.pyplot as plt
from matplotlib.ticker import FormatStrFormatter

from tokenfair.experiments.frontier import FrontierCell
from tokenfair.report.document import Block, Heading, Image, Paragraph, Table, to_html, to_markdown
from tokenfair.report.figures import DPI, FIGURES_DIR

FIGURE = f"{FIGURES_DIR}/frontier.png"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
HEADER = (
    "policy",
    "pool",
    "throughput (tok/s)",
    "÷ vtc",
    "Max Diff",
    "÷ vtc",
    "Max Diff per tok/s",
    "÷ vtc",
    "Avg Diff ÷ vtc",
    "prefix hit rate",
    "preemptions",
    "backlogged clients",
)


def _quantum(policy: str) -> float | None:
    """dlpm's quantum (4,096 when unnamed), None for other policies."""
    name, _, arg = policy.partition(":")
    if name != "dlpm":
        return None
    return float(arg) if arg else 4096.0


def _x(cell: FrontierCell) -> float | None:
    return cell.throughput_vs_vtc


def _y(cell: FrontierCell) -> float | None:
    return cell.max_diff_per_throughput_vs_vtc


def plot_frontier(cells: Sequence[FrontierCell], out_dir: Path) -> str:
    """One panel per variant; the figure's path relative to `out_dir`."""
    variants = list(dict.fromkeys(c.variant for c in cells))
    policies = list(dict.fromkeys(c.policy for c in cells))
    pools = sorted({c.pool_fraction for c in cells})
    colors = {p: plt.get_cmap("tab10")(i % 10) for i, p in enumerate(policies)}
    markers = {pool: MARKERS[i % len(MARKERS)] for i, pool in enumerate(pools)}
    columns = min(3, len(variants))
    rows = -(-len(variants) // columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(5.2 * columns, 4.2 * rows), squeeze=False, layout="constrained"
    )
    for ax, variant in zip(axes.flat, variants, strict=False):
        shown = [c for c in cells if c.variant == variant and _x(c) and _y(c)]
        for pool in sorted({c.pool_fraction for c in shown}):
            curve = sorted(
                (c for c in shown if c.pool_fraction == pool and _quantum(c.policy) is not None),
                key=lambda c: _quantum(c.policy) or 0.0,
            )
            if len(curve) > 1:
                ax.plot([_x(c) for c in curve], [_y(c) for c in curve], color="#bbbbbb", lw=1)
            for c in shown:
                if c.pool_fraction == pool:
                    ax.scatter(
                        _x(c), _y(c), color=colors[c.policy], marker=markers[pool], s=36, zorder=3
                    )
        ax.axhline(1.0, color="#999999", lw=0.6, ls=":")
        ax.axvline(1.0, color="#999999", lw=0.6, ls=":")
        xs, ys = [x for c in shown if (x := _x(c))], [y for c in shown if (y := _y(c))]
        if ys and max(ys) / min(ys) > 4:  # log only where the range needs it
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        elif ys:  # a narrow range is shown at least +-10-25% wide: noise stays small
            ax.set_ylim(min(0.8, min(ys) - 0.05), max(1.25, max(ys) + 0.05))
        if xs:
            ax.set_xlim(min(0.95, min(xs) - 0.03), max(1.1, max(xs) + 0.05))
        ax.set_title(variant, fontsize=10)
        ax.set_xlabel("throughput ÷ VTC's")
        ax.set_ylabel("Max Diff per throughput ÷ VTC's")
    for ax in list(axes.flat)[len(variants) :]:
        ax.axis("off")
    handles = [
        plt.Line2D([], [], color=colors[p], marker="o", ls="", label=p) for p in policies
    ] + [
        plt.Line2D([], [], color="#555555", marker=markers[pool], ls="", label=f"pool {pool:g}")
        for pool in pools
    ]
    fig.legend(handles=handles, loc="outside right center", fontsize=8)
    (out_dir / FIGURES_DIR).mkdir(parents=True, exist_ok=True)
    fig.savefig(out_dir / FIGURE, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return FIGURE


def _times(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def variant_table(cells: Sequence[FrontierCell]) -> Table:
    first = cells[0]
    return Table(
        HEADER,
        tuple(
            (
                c.policy,
                f"{c.pool_fraction:g} ({c.kv_tokens:,})",
                f"{c.throughput_tok_s:,.0f}",
                _times(c.throughput_vs_vtc),
                f"{c.max_diff:,.1f}",
                _times(c.max_diff_vs_vtc),
                f"{c.max_diff_per_throughput:.3f}",
                _times(c.max_diff_per_throughput_vs_vtc),
                _times(c.avg_diff_vs_vtc),
                f"{c.prefix_hit_rate:.0%}",
                f"{c.preemptions:,.0f}",
                f"{c.backlogged_clients:.1f} of {c.clients}",
            )
            for c in cells
        ),
        caption=f"{first.variant}: pool as a fraction of the prefixes' footprint (tokens); "
        f"mean of {first.seeds} seed(s); ratios to VTC's in the same pool.",
    )


def frontier_blocks(cells: Sequence[FrontierCell], figure: str | None) -> list[Block]:
    blocks: list[Block] = [
        Heading("The fairness-efficiency frontier with prefix caching", 2),
        Paragraph(
            "Clients asking about long documents of their own (the `documents` workload) on "
            "the engine preset with prefix caching, a KV pool holding a fraction of the "
            "documents. Each policy's throughput and Max Diff per unit of throughput, as "
            "ratios to VTC's in the same pool: right is faster, down is fairer for what "
            "is served. The controls hold every prefix, so the cache has nothing to give."
        ),
    ]
    if figure is not None:
        blocks.append(
            Image(
                figure,
                "throughput over VTC against Max Diff per throughput over VTC",
                "One point per policy and pool (marker); the dlpm quanta of a pool are "
                "joined in order of the quantum.",
            )
        )
    for variant in dict.fromkeys(c.variant for c in cells):
        blocks.append(variant_table([c for c in cells if c.variant == variant]))
    return blocks


def write_frontier_report(
    cells: Sequence[FrontierCell], out_dir: Path, settings: dict[str, Any] | None = None
) -> Path:
    """OUT/report.md, OUT/report.html and OUT/figures/frontier.png."""
    title = "tokenfair: the fairness-efficiency frontier with prefix caching"
    lines = [f"{k}: {v}" for k, v in (settings or {}).items()]
    blocks: list[Block] = [Heading(title, 1)]
    if lines:
        blocks.append(Paragraph("Settings. " + "; ".join(str(line) for line in lines) + "."))
    blocks += frontier_blocks(cells, plot_frontier(cells, out_dir))
    report = out_dir / "report.md"
    report.write_text(to_markdown(blocks), encoding="utf-8")
    (out_dir / "report.html").write_text(to_html(blocks, title), encoding="utf-8")
    return report
