"""The report's section on the paper's workloads drawn several times: each policy's
Max Diff, Avg Diff and throughput as a median and a range over the draws (the synthetic
suites drawn with other seeds, the arena trace replayed with its arrivals jittered by
up to 1 ms), and which of the paper's results each workload stands for."""

from __future__ import annotations

from collections.abc import Sequence

from tokenfair.experiments.seeds import JITTER_S, SeedSpread, Spread
from tokenfair.experiments.workloads import ARENA, PAPER_RESULTS
from tokenfair.report.document import Block, Heading, Paragraph, Table

HEADER = (
    "workload",
    "in the paper",
    "policy",
    "draws",
    "Max Diff",
    "Avg Diff",
    "throughput (tok/s)",
)


def _spread(spread: Spread, digits: int = 1) -> str:
    return f"{spread.median:,.{digits}f} ({spread.low:,.{digits}f} – {spread.high:,.{digits}f})"


def jitter_sentence(rows: Sequence[SeedSpread]) -> str:
    """How far the arena's figures move when its arrivals move by up to 1 ms."""
    arena = [row for row in rows if row.suite == ARENA]
    if not arena:
        return ""
    widest = max(arena, key=lambda row: row.max_diff.high - row.max_diff.low)
    still = [row.label for row in arena if row.max_diff.high == row.max_diff.low]
    milliseconds = f"{JITTER_S * 1e3:g} ms"
    text = (
        f"Moving every arrival of the arena trace by up to {milliseconds} (a uniform "
        f"draw per arrival, seed k for draw k) moves Max Diff most under "
        f"`{widest.label}`: {widest.max_diff.low:,.1f} to {widest.max_diff.high:,.1f} "
        f"(median {widest.max_diff.median:,.1f}, the table shows draw 0's)."
    )
    if still:
        text += f" It does not move under {', '.join(f'`{label}`' for label in still)}."
    return text + " A policy's single Max Diff on the arena trace is one draw from such a range."


def seed_blocks(rows: Sequence[SeedSpread]) -> list[Block]:
    if not rows:
        return []
    draws = rows[0].seeds
    table = Table(
        HEADER,
        tuple(
            (
                row.suite + (" (arrivals ±1 ms)" if row.suite == ARENA else ""),
                PAPER_RESULTS.get(row.suite, "–"),
                row.label,
                str(row.seeds),
                _spread(row.max_diff),
                _spread(row.avg_diff),
                _spread(row.throughput_tok_s, 0),
            )
            for row in rows
        ),
        caption="Median over the draws, and in parentheses the lowest and the highest.",
    )
    return [
        Heading("Across seeds", 3),
        Paragraph(
            f"Every workload drawn {draws} times under the same policies (draws 0 to "
            f"{draws - 1}; the tables above show draw 0): each synthetic suite generated "
            "with seeds 0 to "
            f"{draws - 1}, and the arena trace replayed with its arrivals jittered. How "
            "far each figure moves from one draw of a workload to the next: a difference "
            "between two policies smaller than their ranges here is not one the workload "
            "can tell."
        ),
        *([Paragraph(sentence)] if (sentence := jitter_sentence(rows)) else []),
        table,
    ]
