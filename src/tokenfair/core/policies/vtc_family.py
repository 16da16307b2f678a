"""The VTC family's names: one `VTCPolicy` (vtc.py) set seven ways.

`vtc` is the paper's policy; the others change one rule each (the lift, what is charged
up front, preemption, the artifact's quirks) to measure what that rule is worth.
"""

from __future__ import annotations

from tokenfair.core.policies.declaration import Argument, Declared, Needs
from tokenfair.core.policies.predictor import OraclePredictor, OutputLengthPredictor
from tokenfair.core.policies.vtc import VTCPolicy

# Tuned on the arena trace (docs/fairness.md): lower thresholds preempt more and cost
# throughput in recomputation; higher ones rarely preempt at all.
DEFAULT_PREEMPT_THRESHOLD = 3000.0

DECLARED = [
    Declared(
        "lcf",
        "least counter first: VTC without the lift",
        lambda settings, arg: VTCPolicy(settings, name="lcf", lift="none"),
        needs=Needs(weights=True, groups_lift="none", shared_lift="none"),
    ),
    Declared(
        "vtc",
        "Virtual Token Counter with the paper's lift rule",
        lambda settings, arg: VTCPolicy(settings, name="vtc"),
        needs=Needs(weights=True, groups_lift="paper", shared_lift="paper"),
    ),
    Declared(
        "wvtc",
        "weighted VTC: service shared in proportion to client weights (needs weights)",
        lambda settings, arg: VTCPolicy(settings, name="wvtc"),
        needs=Needs(
            weights=True,
            weights_required=True,
            groups_lift="paper",
            shared_lift="paper",
        ),
    ),
    Declared(
        "vtc-artifact",
        "the paper artifact's VTC queue exactly: its lift (none when nobody else waits), "
        "ties to the client seen first, and an extra output charge for the whole batch "
        "whenever one of its requests finishes",
        lambda settings, arg: VTCPolicy(
            settings,
            name="vtc-artifact",
            lift="artifact",
            ties_to_first_seen=True,
            charge_batch_on_finish=True,
        ),
        needs=Needs(weights=True, shared_lift="artifact"),
    ),
    Declared(
        "vtc-predict",
        "VTC charging a per-client moving-average output prediction up front",
        lambda settings, arg: VTCPolicy(
            settings, name="vtc-predict", predictor=OutputLengthPredictor()
        ),
        needs=Needs(weights=True),
    ),
    Declared(
        "vtc-oracle",
        "VTC charging the true output length up front (experiments only)",
        lambda settings, arg: VTCPolicy(settings, name="vtc-oracle", predictor=OraclePredictor()),
        needs=Needs(weights=True, vllm=False),
    ),
    Declared(
        "vtc-preempt",
        "VTC that preempts an over-served client's newest request when a waiting client "
        f"is more than `threshold` (default {DEFAULT_PREEMPT_THRESHOLD:g}) behind",
        lambda settings, threshold: VTCPolicy(
            settings, name="vtc-preempt", preempt_threshold=threshold
        ),
        argument=Argument("threshold", DEFAULT_PREEMPT_THRESHOLD),
        needs=Needs(weights=True, vllm=False),
    ),
]
