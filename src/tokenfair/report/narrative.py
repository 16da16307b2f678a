"""One short paragraph per workload, written from the numbers of the run.

Every sentence is a comparison computed here (which is lower, by what factor), so the
text can never claim what the numbers do not show. The baseline is FCFS when it ran,
else the first policy; the policy in focus is VTC (weighted VTC on weighted workloads)
when it ran, else the second policy.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenfair.experiments.runner import RunOutcome
from tokenfair.experiments.workloads import Workload
from tokenfair.fairness.bounds import BACKLOGGED, service_bound
from tokenfair.fairness.curves import service_in_interval

# Throughput within this fraction of the baseline's counts as "the same".
SAME_THROUGHPUT = 0.02


def _pick(outcomes: Sequence[RunOutcome], names: Sequence[str], fallback: int) -> RunOutcome:
    for name in names:
        for outcome in outcomes:
            if outcome.policy == name:
                return outcome
    return outcomes[min(fallback, len(outcomes) - 1)]


def _compare(value: float, reference: float) -> str:
    if reference == 0:
        return "equal" if value == 0 else "above zero"
    return f"{value / reference:.2f}x"


def _name(outcome: RunOutcome) -> str:
    return f"`{outcome.label}`"


def _diff_sentence(focus: RunOutcome, base: RunOutcome) -> str:
    f, b = focus.report, base.report
    return (
        f"{_name(focus)}'s Max Diff is {f.max_diff:.1f} against {_name(base)}'s "
        f"{b.max_diff:.1f} ({_compare(f.max_diff, b.max_diff)}) and its Avg Diff "
        f"{f.avg_diff:.1f} against {b.avg_diff:.1f} "
        f"({_compare(f.avg_diff, b.avg_diff)})."
    )


def _fairest_sentence(outcomes: Sequence[RunOutcome]) -> str:
    # A rate limiter lowers Diff by rejecting work, so the fairest is sought among the
    # policies that served every request.
    complete = [o for o in outcomes if o.report.num_served == o.report.num_requests]
    if len(complete) < 2:
        return ""
    best = min(complete, key=lambda o: o.report.max_diff)
    return (
        f"Among policies that served every request, {_name(best)} has the lowest Max Diff "
        f"({best.report.max_diff:.1f})."
    )


def _throughput_sentence(outcomes: Sequence[RunOutcome], base: RunOutcome) -> str:
    reference = base.report.throughput_tok_s
    if reference <= 0:
        return ""
    lower = [
        f"{_name(o)} ({o.report.throughput_tok_s:.0f}, {o.report.throughput_tok_s / reference:.2f}x)"
        for o in outcomes
        if o.report.throughput_tok_s < (1 - SAME_THROUGHPUT) * reference
    ]
    if not lower:
        return (
            f"Every policy keeps throughput within {SAME_THROUGHPUT:.0%} of {_name(base)}'s "
            f"{reference:.0f} tok/s or above."
        )
    return (
        f"Throughput falls below {_name(base)}'s {reference:.0f} tok/s for "
        + ", ".join(lower)
        + "."
    )


def _backlog_sentence(workload: Workload, focus: RunOutcome, base: RunOutcome) -> str:
    ours = focus.report.accumulated_difference
    theirs = base.report.accumulated_difference
    if ours.scope != BACKLOGGED or theirs.scope != BACKLOGGED:
        return ""
    bound = service_bound(workload.records, focus.job.config.kv_tokens)
    relation = "within" if ours.peak <= bound else "above"
    return (
        f"The clients backlogged throughout ({', '.join(focus.report.backlogged)}) end "
        f"{ours.final:,.0f} service units apart at T under {_name(focus)} (peak "
        f"{ours.peak:,.0f}, {relation} VTC's bound B = {bound:,.0f}) and "
        f"{theirs.final:,.0f} apart under {_name(base)}."
    )


def _light_client_sentence(focus: RunOutcome, base: RunOutcome) -> str:
    # Only meaningful for a client asking for less than its share, i.e. one the focus
    # policy does not keep waiting.
    clients = focus.report.clients
    if len(clients) < 2:
        return ""
    demand = {c: v.requests.total for c, v in clients.items()}
    lightest = min(demand, key=lambda c: (demand[c], c))
    if lightest in focus.report.backlogged or lightest not in base.report.clients:
        return ""
    f_p90 = clients[lightest].ttft_s.p90
    b_p90 = base.report.clients[lightest].ttft_s.p90
    if f_p90 is None or b_p90 is None:
        return ""
    return (
        f"The client sending the fewest requests, {lightest}, is not kept waiting under "
        f"{_name(focus)}: it waits {f_p90:.1f} s for its "
        f"first token at p90 under {_name(focus)} and {b_p90:.1f} s under {_name(base)}."
    )


def _weighted_sentence(workload: Workload, focus: RunOutcome) -> str:
    if not workload.weights:
        return ""
    # Shares within [warmup, T]: over the whole run, which drains every backlog after T,
    # each client ends up with what it asked for.
    served = service_in_interval(focus.results, workload.warmup_s, workload.duration_s)
    served_total = sum(served.values()) or 1.0
    weight_total = sum(workload.weights.values())
    shares = ", ".join(
        f"{c} {served.get(c, 0.0) / served_total:.2f} (weight share "
        f"{workload.weights[c] / weight_total:.2f})"
        for c in sorted(workload.weights)
    )
    return f"Between {workload.warmup_s:g} s and T, {_name(focus)}'s service shares are {shares}."


def workload_paragraph(workload: Workload, outcomes: Sequence[RunOutcome]) -> str:
    """What the numbers of one workload show, in a few computed sentences."""
    if not outcomes:
        return f"No runs on {workload.name}."
    base = _pick(outcomes, ["fcfs"], 0)
    focus_names = ["wvtc", "vtc"] if workload.weights else ["vtc"]
    focus = _pick(outcomes, focus_names, 1)
    sentences = [
        f"{workload.description} ({len(workload.records):,} requests, measured over "
        f"T = {workload.duration_s:g} s)."
    ]
    if focus is not base:
        sentences.append(_diff_sentence(focus, base))
    sentences += [
        _fairest_sentence(outcomes),
        _throughput_sentence(outcomes, base),
    ]
    if focus is not base:
        sentences += [
            _backlog_sentence(workload, focus, base),
            _light_client_sentence(focus, base),
        ]
    sentences.append(_weighted_sentence(workload, focus))
    text = " ".join(s for s in sentences if s)
    return text[:1].upper() + text[1:]
