"""Which waiting request goes next, and what it costs its tenant.

`admission.py` is the loop that decides, whenever a request arrives or capacity frees,
by asking three seams in turn (as llm-d's flow control separates them):

- `bands.py`: the priority band of a tenant; strict between bands, per model;
- `fairness.py`: which tenant goes next inside a band (the core's policies by name,
  VTC's counters shared through Redis), and the one door to those counters;
- `order.py`: the order of one tenant's own requests (arrival, or `priority`).

`ticket.py` is one request's passage through the queue, which every seam reads (kept
apart: admission.py and fairness.py import the seams that read it, so in either of
them it would close an import cycle).
`meter.py` is what a request costs as it happens, charged through `fairness.py`;
`tokens.py` counts tokens without running the model.

Above upstreams/ and replicas/, below transport/: may import, of the rest of the
gateway, messages.py (a message's text), upstreams/pool.py (where a request may go),
upstreams/prefix.py (what the router places it by), and replicas/counters.py from
fairness.py alone.
"""
