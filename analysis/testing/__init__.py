"""Helpers for tests and benchmarks (synthetic sweeps with known answers); no analysis of a user's data uses them."""
