"""The long-context-neighbour section of the experiment report: a table per case and
the step-share trade figure (experiments/neighbor.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI

import matplotlib.pyplot as plt

from tokenfair.experiments.neighbor import ALONE, CASES, SWEEP_PREFIX, NeighborRow
from tokenfair.report.document import Block, Heading, Image, Paragraph, Table
from tokenfair.report.figures import DPI, FIGURES_DIR

FIGURE = f"{FIGURES_DIR}/step_share.png"
HEADER = (
    "run",
    "chat TTFT p50 (s)",
    "chat TTFT p99 (s)",
    "÷ alone",
    "chat TPOT p50 (s)",
    "÷ alone",
    "long tenant (tok/s)",
    "÷ fcfs",
    "chat requests preempted",
)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _times(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}x"


def case_table(rows: Sequence[NeighborRow]) -> Table:
    return Table(
        HEADER,
        tuple(
            (
                r.run,
                _fmt(r.chat_ttft_p50_s),
                _fmt(r.chat_ttft_p99_s),
                _times(r.ttft_p99_x_alone),
                _fmt(r.chat_tpot_p50_s, 4),
                _times(r.tpot_p50_x_alone),
                _fmt(r.long_tok_s, 0),
                _fmt(r.long_x_fcfs, 2),
                _fmt(r.chat_preemptions, 0),
            )
            for r in rows
            if not r.run.startswith(SWEEP_PREFIX)
        ),
        "Medians over the seeds. Charges only: memory and step not shared (the engine "
        "before it shared what a tenant holds); the default shares both "
        "(docs/fairness.md, \u201cWhat a tenant holds\u201d).",
    )


def neighbor_blocks(rows: Sequence[NeighborRow], figure: str | None) -> list[Block]:
    if not rows:
        return []
    blocks: list[Block] = [
        Heading("A long-context neighbour"),
        Paragraph(
            "Beyond the paper. VTC shares the tokens a tenant is charged; a tenant flooding "
            "long prompts also holds the KV memory and the time of the steps its prefill "
            "takes. The chat tenants' latency beside it, against the same chat traffic "
            "alone, and the long tenant's throughput against what it gets under fcfs."
        ),
    ]
    for case in CASES:
        mine = [r for r in rows if r.case == case.name]
        if mine:
            blocks += [
                Heading(f"{case.name}: {case.spec.describe()}", 3),
                Paragraph(f"Profile {case.profile}, a {case.kv_tokens:,}-token KV pool."),
                case_table(mine),
            ]
    if figure:
        blocks.append(Image(figure, "The step share's trade (holdings shared)"))
    return blocks


def plot_step_share(rows: Sequence[NeighborRow], out_dir: Path) -> str | None:
    """The trade the step share sets: the chat tenants' TPOT and TTFT p99 against the
    long tenant's throughput, one point per step share; None without sweep rows."""
    cases = [
        c for c in CASES if any(r.case == c.name and r.run.startswith(SWEEP_PREFIX) for r in rows)
    ]
    if not cases:
        return None
    fig, axes = plt.subplots(1, len(cases), figsize=(5.5 * len(cases), 4), squeeze=False)
    for ax, case in zip(axes[0], cases, strict=True):
        sweep = sorted(
            (int(r.run.removeprefix(SWEEP_PREFIX)), r)
            for r in rows
            if r.case == case.name and r.run.startswith(SWEEP_PREFIX)
        )
        alone = next((r for r in rows if r.case == case.name and r.run == ALONE), None)
        xs = [r.long_x_fcfs or 0.0 for _, r in sweep]
        ax.plot(xs, [r.chat_tpot_p50_s * 1000 for _, r in sweep], "o-", label="chat TPOT p50")
        ax.plot(xs, [r.chat_ttft_p99_s * 1000 for _, r in sweep], "s-", label="chat TTFT p99")
        for (tokens, r), x in zip(sweep, xs, strict=True):
            ax.annotate(f"{tokens}", (x, r.chat_ttft_p99_s * 1000), fontsize=7)
        if alone is not None:
            ax.axhline(alone.chat_ttft_p99_s * 1000, color="grey", ls=":", label="TTFT p99 alone")
        ax.set_yscale("log")
        ax.set_xlabel("long tenant's throughput ÷ fcfs's")
        ax.set_ylabel("ms")
        ax.set_title(f"{case.name}: step share (tokens per step)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / FIGURE
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return FIGURE
