"""The report's section on a sweep (`--sweep`): a table of each point's figures per
workload, and Max Diff against the swept argument, one panel per workload."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI

import matplotlib.pyplot as plt

from tokenfair.experiments.runner import RunOutcome
from tokenfair.experiments.sweep import SweepRow, SweepSummary
from tokenfair.report.document import Block, Heading, Image, Paragraph, Table
from tokenfair.report.figures import DPI, FIGURES_DIR

FIGURE = f"{FIGURES_DIR}/sweep.png"
# Lines drawn across each panel for reference, where they ran on that workload.
REFERENCES = {"fcfs": ":", "vtc": "--"}


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def plot_sweep(sweep: SweepSummary, outcomes: Sequence[RunOutcome], out_dir: Path) -> str | None:
    """Max Diff against the first swept argument, one panel per workload, one line per
    setting of the other swept arguments; FCFS and VTC as horizontal lines."""
    if not sweep.rows:
        return None
    workloads = list(dict.fromkeys(r.workload for r in sweep.rows))
    (axis_name, values), *others = sweep.varied.items()
    numeric = _numeric(values)
    columns = min(3, len(workloads))
    rows = -(-len(workloads) // columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False, layout="constrained"
    )
    for axis, workload in zip(axes.flat, workloads, strict=False):
        points = [r for r in sweep.rows if r.workload == workload]
        for setting in itertools.product(*(v for _, v in others)) if others else [()]:
            fixed = dict(zip((name for name, _ in others), setting, strict=True))
            line = [r for r in points if all(r.arguments[k] == v for k, v in fixed.items())]
            xs = [
                r.arguments[axis_name] if numeric else values.index(r.arguments[axis_name])
                for r in line
            ]
            name = ", ".join(f"{k}={v!r}" for k, v in fixed.items()) or None
            axis.plot(xs, [r.max_diff for r in line], marker="o", label=name)
        for outcome in outcomes:
            style = REFERENCES.get(outcome.policy)
            if style and outcome.workload.name == workload and not outcome.job.variant:
                axis.axhline(
                    outcome.report.max_diff, color="grey", linestyle=style, label=outcome.label
                )
        if not numeric:
            axis.set_xticks(range(len(values)), [repr(v) for v in values])
        axis.set_title(workload, fontsize=10)
        axis.set_xlabel(axis_name)
        axis.set_ylabel("Max Diff")
        axis.legend(fontsize=7)
    for axis in list(axes.flat)[len(workloads) :]:
        axis.set_visible(False)
    (out_dir / FIGURES_DIR).mkdir(parents=True, exist_ok=True)
    fig.savefig(out_dir / FIGURE, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return FIGURE


def sweep_table(sweep: SweepSummary) -> Table:
    names = list(sweep.varied)
    body = tuple(
        (
            row.workload,
            *(repr(row.arguments[name]) for name in names),
            f"{row.max_diff:,.2f}",
            f"{row.avg_diff:,.2f}",
            f"{row.throughput_tok_s:,.0f}",
        )
        for row in _ordered(sweep.rows)
    )
    header = ("workload", *names, "Max Diff", "Avg Diff", "Throughput (tok/s)")
    return Table(header, body, "One row per point of the sweep and workload.")


def _ordered(rows: Sequence[SweepRow]) -> list[SweepRow]:
    """By workload (in the order run), then in the sweep's own order."""
    workloads = list(dict.fromkeys(r.workload for r in rows))
    return sorted(rows, key=lambda r: workloads.index(r.workload))


def sweep_blocks(sweep: SweepSummary | None, figure: str | None) -> list[Block]:
    if sweep is None:
        return []
    missing = len(sweep.points) - len({r.policy for r in sweep.rows})
    lines = [
        f"`{sweep.spec}`: {len(sweep.points)} points, each argument given as a list "
        "taking each of its values; each point is also a row of the tables above."
        + (f" {missing} failed and are left out." if missing else "")
    ]
    blocks: list[Block] = [
        Heading(f"Sweep over {', '.join(sweep.varied)}"),
        *(Paragraph(line) for line in lines),
    ]
    if sweep.rows:
        blocks.append(sweep_table(sweep))
    if figure is not None:
        blocks.append(
            Image(
                figure,
                "Max Diff against the swept argument",
                f"Max Diff against {next(iter(sweep.varied))}, one panel per workload; "
                "FCFS and VTC, where they ran, as grey lines.",
            )
        )
    return blocks
