"""Reads a sweep's records, compares its runs, and writes report.md, its tables and plots (`python -m analysis`)."""
