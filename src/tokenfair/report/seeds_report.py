"""The report's section on the synthetic suites drawn with several seeds: each
policy's Max Diff, Avg Diff and throughput as a mean and a range over the draws."""

from __future__ import annotations

from collections.abc import Sequence

from tokenfair.experiments.seeds import SeedSpread, Spread
from tokenfair.report.document import Block, Heading, Paragraph, Table

HEADER = ("suite", "policy", "draws", "Max Diff", "Avg Diff", "throughput (tok/s)")


def _spread(spread: Spread, digits: int = 1) -> str:
    return f"{spread.mean:,.{digits}f} ({spread.low:,.{digits}f} – {spread.high:,.{digits}f})"


def seed_blocks(rows: Sequence[SeedSpread]) -> list[Block]:
    if not rows:
        return []
    draws = rows[0].seeds
    table = Table(
        HEADER,
        tuple(
            (
                row.suite,
                row.label,
                str(row.seeds),
                _spread(row.max_diff),
                _spread(row.avg_diff),
                _spread(row.throughput_tok_s, 0),
            )
            for row in rows
        ),
        caption="Mean over the draws, and in parentheses the lowest and the highest.",
    )
    return [
        Heading("Across seeds", 3),
        Paragraph(
            f"Every synthetic suite drawn {draws} times (seeds 0 to {draws - 1}; the tables "
            "above show seed 0), under the same policies: how far each figure moves from "
            "one draw of a suite to the next. A difference between two policies smaller "
            "than their ranges here is not one the suite can tell."
        ),
        table,
    ]
