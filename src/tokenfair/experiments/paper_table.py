"""The paper's real-trace table (SPEC section 7): the only typed-in numbers of the report.

Measured by the paper's authors with Llama-7B on an A10G, a 10,000-token KV pool, on
`shared/traces/arena_vtc_600s.jsonl`, service priced with w_in = 1 and w_out = 2. Keys
are tokenfair policy names; the report shows these beside the simulated numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

PAPER_LABEL = "paper (A10G, measured)"


@dataclass(frozen=True, slots=True)
class PaperRow:
    scheduler: str  # as the paper names it
    max_diff: float
    avg_diff: float
    diff_var: float
    throughput_tok_s: float


PAPER_ARENA_TABLE: dict[str, PaperRow] = {
    "fcfs": PaperRow("FCFS", 759.97, 433.53, 32112.00, 777),
    "lcf": PaperRow("LCF", 750.49, 323.82, 29088.90, 778),
    "vtc": PaperRow("VTC", 368.40, 251.66, 6549.16, 779),
    "vtc-predict": PaperRow("VTC (predict)", 365.47, 240.33, 5321.62, 773),
    "vtc-oracle": PaperRow("VTC (oracle)", 329.46, 227.51, 4475.76, 781),
    "rpm:5": PaperRow("RPM(5)", 143.86, 83.58, 1020.46, 340),
    "rpm:20": PaperRow("RPM(20)", 446.76, 195.71, 7449.79, 694),
    "rpm:30": PaperRow("RPM(30)", 693.66, 309.45, 24221.31, 747),
}
