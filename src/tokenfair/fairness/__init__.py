"""Fairness metrics of a run: pure functions of per-request results (numpy, no runs)."""
