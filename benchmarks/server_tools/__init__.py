"""Helpers of the server benchmarks (not benchmarks themselves)."""
