"""Experiments: workloads run under policies in the simulator, scored by tokenfair.fairness."""
