"""The gateway's flow control, in three seams (as llm-d's flow control separates them):

- `bands.py`: the priority band of a tenant; strict between bands, per model;
- `fairness.py`: which tenant goes next inside a band (the core's policies by name,
  VTC's counters shared through Redis);
- `order.py`: the order of one tenant's own requests (arrival, or `priority`).

`gateway/admission.py` is the loop that calls them.
"""
