"""The experiment report: DIR/report.md and DIR/report.html, from one run's numbers.

Sections: how the run was made, the paper's findings as targets (reproduced or not,
with the measured value), the real-trace table beside the paper's (the only typed-in numbers, labelled as
the paper's), one paragraph, table and figures per workload, the ablation, the list of
figures. Sections without data (e.g. no arena trace in a `compare` run) are left out.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol

from tokenfair.core.cost import DEFAULT_COST
from tokenfair.core.policies.loading import policy_label
from tokenfair.experiments.ablation import AblationRow, length_sweep, pool_sweep
from tokenfair.experiments.experiment import ExperimentResult
from tokenfair.experiments.paper_table import PAPER_ARENA_TABLE, PAPER_LABEL
from tokenfair.experiments.runner import RunOutcome
from tokenfair.experiments.summary import ratio, summary_row
from tokenfair.experiments.targets import TargetCheck
from tokenfair.fairness.bounds import BACKLOGGED
from tokenfair.report.document import (
    Block,
    Bullets,
    Heading,
    Image,
    Paragraph,
    Table,
    to_html,
    to_markdown,
)
from tokenfair.report.figures import Figure, experiment_figures
from tokenfair.report.locality_report import locality_blocks, plot_locality
from tokenfair.report.narrative import workload_paragraph
from tokenfair.report.neighbor_report import neighbor_blocks, plot_step_share
from tokenfair.report.seeds_report import seed_blocks
from tokenfair.report.sweep_report import plot_sweep, sweep_blocks
from tokenfair.report.validation_figure import validation_figures

ARENA = "arena"
LOCALITY = "locality"  # the figure's workload label: it spans the prefix suites
NEIGHBOR = "long-neighbor"  # the step-share figure's, across both cases
SWEEP = "sweep"  # the sweep figure's, across the workloads
SIMULATED_LABEL = "tokenfair (simulated)"
ARENA_HEADER = (
    "scheduler",
    "source",
    "Max Diff",
    "Avg Diff",
    "Diff Var",
    "Throughput (tok/s)",
    "Max Diff ÷ FCFS",
    "Avg Diff ÷ FCFS",
    "Throughput ÷ FCFS",
)


def fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


class Headline(Protocol):
    """A row of the paper's table: ours (RunSummary) or the paper's (PaperRow)."""

    @property
    def max_diff(self) -> float: ...
    @property
    def avg_diff(self) -> float: ...
    @property
    def diff_var(self) -> float: ...
    @property
    def throughput_tok_s(self) -> float: ...


def _ratios(row: Headline, base: Headline | None) -> list[str]:
    if base is None:
        return ["–", "–", "–"]
    return [
        fmt(ratio(row.max_diff, base.max_diff), 3),
        fmt(ratio(row.avg_diff, base.avg_diff), 3),
        fmt(ratio(row.throughput_tok_s, base.throughput_tok_s), 3),
    ]


def arena_table_rows(outcomes: Sequence[RunOutcome]) -> list[tuple[str, ...]]:
    """Two rows per scheduler: ours, then the paper's where the paper has it."""
    ours = {o.policy: summary_row(o) for o in outcomes}
    paper = PAPER_ARENA_TABLE
    rows = []
    for policy, row in ours.items():
        rows.append(
            (
                row.label,
                SIMULATED_LABEL,
                fmt(row.max_diff),
                fmt(row.avg_diff),
                fmt(row.diff_var),
                fmt(row.throughput_tok_s, 0),
                *_ratios(row, ours.get("fcfs")),
            )
        )
        if policy in paper:
            ref = paper[policy]
            rows.append(
                (
                    "",
                    PAPER_LABEL,
                    fmt(ref.max_diff),
                    fmt(ref.avg_diff),
                    fmt(ref.diff_var),
                    fmt(ref.throughput_tok_s, 0),
                    *_ratios(ref, paper["fcfs"]),
                )
            )
    return rows


def _cached(outcomes: Sequence[RunOutcome]) -> bool:
    """Whether the runs had a prefix cache (their figures then include its hit rate)."""
    return any(o.job.config.enable_prefix_caching for o in outcomes)


def workload_table(outcomes: Sequence[RunOutcome]) -> Table:
    rows = []
    base = next((summary_row(o) for o in outcomes if o.policy == "fcfs"), None)
    cached = _cached(outcomes)
    for outcome in outcomes:
        row = summary_row(outcome)
        hits = (fmt(None if row.prefix_hit_rate is None else 100 * row.prefix_hit_rate, 1),)
        rows.append(
            (
                row.label,
                fmt(row.max_diff),
                fmt(row.avg_diff),
                fmt(row.diff_var),
                fmt(row.throughput_tok_s, 0),
                _ratios(row, base)[0],
                *(hits if cached else ()),
                fmt(row.ttft_p90_s, 1),
                fmt(row.jain_per_tick_mean, 3),
                f"{row.acc_diff_final:,.0f}" if row.acc_diff_scope == BACKLOGGED else "–",
                str(row.rejected),
                str(row.preemptions),
            )
        )
    header = (
        "policy",
        "Max Diff",
        "Avg Diff",
        "Diff Var",
        "Throughput (tok/s)",
        "Max Diff ÷ FCFS",
        *(("prefix hit rate (%)",) if cached else ()),
        "TTFT p90 (s)",
        "Jain (mean per tick)",
        "acc. service diff at T",
        "rejected",
        "preemptions",
    )
    caption = (
        "acc. service diff at T: max − min service received in [warmup, T] among the "
        "clients backlogged throughout (– when fewer than two are). Jain: mean over the "
        "ticks of Jain's index among clients backlogged in the tick's window (– when no "
        "window has two)."
    )
    if cached:
        caption += (
            " Prefix hit rate: the prompt tokens served from the prefix cache, of all "
            "prompt tokens served."
        )
    return Table(header, tuple(rows), caption)


def cached_tokens_table(outcomes: Sequence[RunOutcome]) -> list[Block]:
    """Each client's prompt tokens served from the prefix cache under each policy;
    nothing when the runs had no prefix cache."""
    rows = [summary_row(o) for o in outcomes if o.job.config.enable_prefix_caching]
    if not rows:
        return []
    clients = sorted({client for row in rows for client in row.cached_tokens or {}})
    body = tuple(
        (client, *(f"{(row.cached_tokens or {}).get(client, 0):,}" for row in rows))
        for client in clients
    )
    return [
        Table(
            ("client", *(row.label for row in rows)),
            body,
            "Prompt tokens served from the prefix cache, per client and policy.",
        )
    ]


def target_blocks(targets: Sequence[TargetCheck]) -> list[Block]:
    if not targets:
        return []
    verdict = {True: "reproduced", False: "not reproduced (a finding)", None: "not run"}
    rows = tuple((t.target, t.measured, verdict[t.passed]) for t in targets)
    met = sum(t.passed is True for t in targets)
    evaluated = sum(t.passed is not None for t in targets)
    return [
        Heading("The paper's findings, as targets"),
        Paragraph(
            f"Each target restates a result of the paper; {met} of {evaluated} evaluated "
            "targets are reproduced by this run. A target not reproduced is reported as "
            "measured, not tuned away: it is a difference between this simulation and the "
            "paper's measured system."
        ),
        Table(("target", "measured", "result"), rows),
    ]


def _trend(values: Sequence[float]) -> str:
    if all(b > a for a, b in itertools.pairwise(values)):
        return "grows"
    if all(b < a for a, b in itertools.pairwise(values)):
        return "shrinks"
    return "does not change monotonically"


def _ablation_table(rows: Sequence[AblationRow], caption: str) -> Table:
    body = tuple(
        (
            policy_label(r.policy),
            f"{r.kv_tokens:,}",
            f"{r.length}/{r.length}",
            f"{r.max_acc_diff:,.0f}",
            f"{r.mean_acc_diff:,.0f}",
            f"{r.bound:,.0f}",
            fmt(r.ratio_to_bound, 3),
            fmt(r.max_diff),
            fmt(r.throughput_tok_s, 0),
        )
        for r in rows
    )
    header = (
        "policy",
        "KV pool (tokens)",
        "in/out tokens",
        "peak acc. service diff",
        "mean acc. service diff",
        "bound B",
        "peak ÷ B",
        "Max Diff",
        "Throughput (tok/s)",
    )
    return Table(header, body, caption)


def ablation_blocks(rows: Sequence[AblationRow], figures: Sequence[Figure]) -> list[Block]:
    if not rows:
        return []
    pools, lengths = pool_sweep(rows), length_sweep(rows)
    text = []
    if len(pools) > 1:
        text.append(
            f"With 256/256-token requests, VTC's peak accumulated service difference "
            f"{_trend([r.max_acc_diff for r in pools])} with the KV pool "
            f"({', '.join(f'{r.max_acc_diff:,.0f} at {r.kv_tokens:,}' for r in pools)})."
        )
    if len(lengths) > 1:
        text.append(
            f"With the {lengths[0].kv_tokens:,}-token pool it "
            f"{_trend([r.max_acc_diff for r in lengths])} with request length "
            f"({', '.join(f'{r.max_acc_diff:,.0f} at {r.length}' for r in lengths)})."
        )
    within = sum(r.max_acc_diff <= r.bound for r in rows if r.policy == "vtc")
    total = sum(r.policy == "vtc" for r in rows)
    text.append(f"VTC stays within its bound B in {within} of {total} settings.")
    fcfs = [r for r in rows if r.policy == "fcfs"]
    if fcfs:
        low, high = min(r.ratio_to_bound for r in fcfs), max(r.ratio_to_bound for r in fcfs)
        text.append(f"FCFS's peak is {low:.2f} to {high:.2f} times B in the same settings.")
    others = sorted(r for r in {r.policy for r in rows} if r != "vtc")
    blocks: list[Block] = [
        Heading("Ablation: KV pool size and request length"),
        Paragraph(
            "Two clients send uniform 3 and 6 req/s of 256/256-token requests for 360 s (the "
            "`overload` suite at twice its rates, so both stay backlogged even with the 65k "
            "pool; longer requests at rates x 256/length, the same tokens per second); the "
            "service difference is the accumulated one between them, from 30 s to 360 s. "
            "B = max(w_in L_in, w_out M) with M the KV pool in tokens."
        ),
        Paragraph(" ".join(text)),
        _ablation_table(
            [r for p in ["vtc", *others] for r in pool_sweep(rows, p)],
            "KV pool sweep (256/256-token requests).",
        ),
        _ablation_table(
            [r for p in ["vtc", *others] for r in length_sweep(rows, p)],
            "Request length sweep (10,000-token pool).",
        ),
    ]
    blocks += [Image(f.path, f.title, f.caption) for f in figures if f.workload == "ablation"]
    return blocks


def _images(figures: Sequence[Figure], workload: str) -> list[Block]:
    return [Image(f.path, f.title, f.caption) for f in figures if f.workload == workload]


def _system(settings: dict) -> str:
    """The scheduler the runs had, in words."""
    caching = "on" if settings.get("prefix_caching") else "off"
    if settings.get("preset") == "engine":
        return (
            "on the engine preset (vLLM-like: optimistic admission, fused chunked prefill, "
            f"16-token blocks, preemption; prefix caching {caching})"
        )
    return (
        "under the paper's router (`SchedulerConfig.paper()`: reserve admission, separate "
        "prefill, admission every 10 decode steps"
        + ("; prefix caching on)" if settings.get("prefix_caching") else ")")
    )


def intro_blocks(result: ExperimentResult) -> list[Block]:
    settings = result.settings
    policies = ", ".join(f"`{policy_label(p)}`" for p in settings.get("policies", []))
    # Only the paper experiment has a quick and a full form, and only its arena table
    # holds the paper's measured rows: a comparison's report says neither.
    paper = "suite_policies" in settings
    mode = (" (quick mode)" if result.quick else " (full mode)") if paper else ""
    quoted = (
        f", except the rows labelled “{PAPER_LABEL}”, which are the paper's Table (SPEC section 7)"
        if result.outcomes_for(ARENA)
        else ""
    )
    lines = [
        f"Generated by tokenfair in {result.wall_s:.0f} s{mode}. Every number below was "
        f"computed in this run{quoted}.",
        f"System: simulated `{settings.get('profile')}` step times {_system(settings)}, "
        f"KV pool {settings.get('kv_tokens', 0):,} tokens. Policies: {policies}.",
    ]
    if "suite_policies" in settings:
        suite_policies = ", ".join(f"`{policy_label(p)}`" for p in settings["suite_policies"])
        lines.append(
            f"The arena trace runs under every policy; the synthetic suites under "
            f"{suite_policies}, and `wvtc` on the weighted suite."
        )
    for failure in result.failures:  # its runs are missing from every table and figure
        lines.append(f"Left out: {failure}.")
    lines.append(
        f"Metrics (SPEC section 6): service = {DEFAULT_COST.unit}; ticks "
        "x_i = (T − warmup)/20 · i, i = 1..19, window w and warmup per workload ("
        + (
            "T = 600 s for the arena trace, the suite's duration otherwise; w = 60 s, warmup = 30 s"
            if paper
            else "; ".join(
                f"{w.name}: T = {w.duration_s:g} s, w = {w.window_s:g} s, warmup = {w.warmup_s:g} s"
                for w in result.workloads
            )
        )
        + "). Throughput counts input + output tokens from the first arrival to the last "
        "finish."
    )
    return [Heading(result.title, 1), *(Paragraph(line) for line in lines)]


def report_blocks(result: ExperimentResult, figures: Sequence[Figure]) -> list[Block]:
    blocks = intro_blocks(result)
    blocks += target_blocks(result.targets)
    arena = result.outcomes_for(ARENA)
    if arena:
        workload = next(w for w in result.workloads if w.name == ARENA)
        blocks += [
            Heading("Real trace (Chatbot Arena, 27 clients, 600 s)"),
            Paragraph(workload_paragraph(workload, arena)),
            Table(
                ARENA_HEADER,
                tuple(arena_table_rows(arena)),
                "Ratios are to FCFS of the same source. RPM's low Diff comes from rejecting "
                "work, which Diff does not punish: read it with throughput.",
            ),
            workload_table(arena),
            *cached_tokens_table(arena),
            *_images(figures, ARENA),
        ]
    others = [w for w in result.workloads if w.name != ARENA and result.outcomes_for(w.name)]
    if others:
        blocks.append(Heading("Synthetic suites" if result.targets else "Workloads"))
    for workload in others:
        outcomes = result.outcomes_for(workload.name)
        blocks += [
            Heading(workload.name, 3),
            Paragraph(workload_paragraph(workload, outcomes)),
            workload_table(outcomes),
            *cached_tokens_table(outcomes),
            *_images(figures, workload.name),
        ]
    sweep_figure = next((f.path for f in figures if f.workload == SWEEP), None)
    blocks += sweep_blocks(result.sweep, sweep_figure)
    blocks += seed_blocks(result.seed_spreads)
    blocks += ablation_blocks(result.ablation, figures)
    if result.locality is not None:
        locality_figure = next((f.path for f in figures if f.workload == LOCALITY), None)
        blocks += locality_blocks(result.locality, locality_figure)
    step_share_figure = next((f.path for f in figures if f.workload == NEIGHBOR), None)
    blocks += neighbor_blocks(result.neighbor, step_share_figure)
    blocks += [
        Heading("Figures"),
        Bullets(tuple(f"`{f.path}`: {f.caption}" for f in figures)),
        Heading("Files"),
        Bullets(
            (
                "`metrics.json`: every run's summary row, the ablation and the target checks.",
                "`results/<workload>/<policy>.jsonl`: per-request results; "
                "`tokenfair metrics FILE --duration T` recomputes any row.",
            )
        ),
    ]
    return blocks


def write_report(result: ExperimentResult, figures: Sequence[Figure]) -> None:
    """Write report.md and report.html into the experiment's output folder."""
    blocks = report_blocks(result, figures)
    result.report_md.write_text(to_markdown(blocks), encoding="utf-8")
    result.report_html.write_text(to_html(blocks, result.title), encoding="utf-8")


def publish(result: ExperimentResult) -> list[Figure]:
    """Draw every figure of an experiment and write its report; returns the figures."""
    figures = experiment_figures(result) + validation_figures(result)
    if result.locality is not None:
        figures.append(
            Figure(
                plot_locality(result.locality, result.out_dir),
                "prefix locality",
                "throughput, prefix hit rate and Max Diff beside the fluid fair-share ideal "
                "per policy, on the suites whose clients share prompt prefixes",
                LOCALITY,
            )
        )
    swept = plot_sweep(result.sweep, result.outcomes, result.out_dir) if result.sweep else None
    if swept is not None:
        figures.append(
            Figure(
                swept,
                "sweep",
                "Max Diff against the swept argument, one panel per workload",
                SWEEP,
            )
        )
    step_share = plot_step_share(result.neighbor, result.out_dir)
    if step_share is not None:
        figures.append(
            Figure(
                step_share,
                "step share",
                "the chat tenants' TPOT and TTFT p99 against the long tenant's throughput, "
                "one point per step share, beside a tenant flooding long prompts",
                NEIGHBOR,
            )
        )
    write_report(result, figures)
    return figures
