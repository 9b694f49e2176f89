"""Benchmarks of the runner itself (`make bench`)."""
