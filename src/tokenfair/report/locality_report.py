"""The locality experiment's report section, table and figure.

`locality_blocks` is the section (a table per suite and the figure); the paper
experiment's report includes it, and `tokenfair experiment locality` writes it alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI

import matplotlib.pyplot as plt

from tokenfair.core.policies.loading import policy_label
from tokenfair.experiments.locality import LocalityResult, LocalityRow
from tokenfair.report.document import Block, Heading, Image, Paragraph, Table, to_html, to_markdown
from tokenfair.report.figures import DPI, FIGURES_DIR

FIGURE = f"{FIGURES_DIR}/locality.png"
HEADER = (
    "policy",
    "throughput (tok/s)",
    "÷ vtc",
    "prefix hit rate",
    "Max Diff",
    "÷ vtc",
    "fluid ideal's Max Diff",
    "behind the ideal (tokens)",
    "light clients' TTFT p90 (s)",
)


def _fmt(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _ratio(value: float, reference: LocalityRow | None, attribute: str) -> str:
    base = getattr(reference, attribute) if reference is not None else 0.0
    return f"{value / base:.2f}x" if base else "–"


def suite_table(rows: Sequence[LocalityRow]) -> Table:
    vtc = next((r for r in rows if r.policy == "vtc"), None)
    return Table(
        HEADER,
        tuple(
            (
                policy_label(r.policy),
                _fmt(r.throughput_tok_s),
                _ratio(r.throughput_tok_s, vtc, "throughput_tok_s"),
                f"{r.prefix_hit_rate:.0%}",
                _fmt(r.max_diff, 1),
                _ratio(r.max_diff, vtc, "max_diff"),
                _fmt(r.fluid_max_diff, 1),
                _fmt(r.fluid_shortfall),
                _fmt(r.light_ttft_p90_s, 1),
            )
            for r in rows
        ),
        caption=f"{rows[0].suite}: KV pool {rows[0].kv_tokens:,} tokens, mean of "
        f"{rows[0].seeds} seeds.",
    )


def plot_locality(result: LocalityResult, out_dir: Path) -> str:
    """Throughput and Max Diff (beside the fluid ideal's) per policy, one row per suite."""
    suites = list(dict.fromkeys(r.suite for r in result.rows))
    fig, axes = plt.subplots(
        len(suites), 2, figsize=(11, 3.4 * len(suites)), squeeze=False, layout="constrained"
    )
    for (left, right), suite in zip(axes, suites, strict=True):
        rows = [r for r in result.rows if r.suite == suite]
        names = [policy_label(r.policy) for r in rows]
        positions = range(len(rows))
        bars = left.bar(list(positions), [r.throughput_tok_s for r in rows], color="#4c72b0")
        left.bar_label(bars, labels=[f"hit {r.prefix_hit_rate:.0%}" for r in rows], fontsize=8)
        left.set_title(f"{suite}: throughput (tok/s)", fontsize=10)
        right.bar(
            [p - 0.2 for p in positions],
            [r.max_diff for r in rows],
            width=0.4,
            label="Max Diff",
            color="#dd8452",
        )
        right.bar(
            [p + 0.2 for p in positions],
            [r.fluid_max_diff for r in rows],
            width=0.4,
            label="fluid fair share at the same capacity",
            color="#bbbbbb",
        )
        # Long labels (a policy of one's own) slant rather than cover their neighbours'.
        slant = {"rotation": 25, "ha": "right"} if max(map(len, names)) > 8 else {}
        for axis in (left, right):
            axis.set_xticks(list(positions), names, **slant)
        right.set_title(f"{suite}: Max Diff", fontsize=10)
        right.legend(fontsize=8)
    (out_dir / FIGURES_DIR).mkdir(parents=True, exist_ok=True)
    fig.savefig(out_dir / FIGURE, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return FIGURE


def locality_blocks(result: LocalityResult, figure: str | None) -> list[Block]:
    settings = result.settings
    blocks: list[Block] = [
        Heading("Fair and cache-efficient: prefix locality", 2),
        Paragraph(
            "Clients that share prompt prefixes (a system prompt each, or conversations "
            "whose every turn repeats the conversation so far) on a vLLM-like engine with "
            f"prefix caching ({settings.get('preset', 'engine preset')}), the "
            f"`{settings.get('profile')}` profile, and KV pools small enough that the "
            "clients' prefixes compete for them. VTC serves the clients in turn, request "
            "by request, and each turn finds its prefix evicted; `vtc-lpm` keeps VTC's "
            "order between clients and takes a client's request with the longest cached "
            "prefix first; `dlpm` lets a client run up to its quantum ahead of the least "
            "served while its prefix is cached. Both tell the cache which blocks waiting "
            "requests will reuse, and it evicts those last. The fluid ideal is a "
            "perfectly fair server (GPS) delivering what the run delivered each second: "
            "its Max Diff is a reference at that capacity, not a bound, and 'behind the "
            "ideal' is the most service the run's clients lacked against it at any tick."
        ),
    ]
    for suite in dict.fromkeys(r.suite for r in result.rows):
        blocks.append(suite_table([r for r in result.rows if r.suite == suite]))
    if figure is not None:
        blocks.append(
            Image(
                figure,
                "throughput, prefix hit rate and Max Diff per policy",
                "Throughput with the prefix hit rate (left); Max Diff beside the fluid "
                "fair-share ideal's at the same capacity (right).",
            )
        )
    return blocks


def write_locality_report(result: LocalityResult, out_dir: Path) -> Path:
    """The locality experiment alone: OUT/report.md, OUT/report.html and its figure."""
    title = "tokenfair: fair and cache-efficient scheduling on clients sharing prefixes"
    blocks: list[Block] = [
        Heading(title, 1),
        Paragraph(
            f"Generated by tokenfair in {result.wall_s:.0f} s; seeds "
            f"{', '.join(str(s) for s in result.settings['seeds'])}. Metrics as SPEC "
            "section 6 (T = the suite's duration, w = 60 s, warm-up 30 s)."
        ),
        *locality_blocks(result, plot_locality(result, out_dir)),
    ]
    report = out_dir / "report.md"
    report.write_text(to_markdown(blocks), encoding="utf-8")
    (out_dir / "report.html").write_text(to_html(blocks, title), encoding="utf-8")
    return report
