"""Reads a sweep's job directories into pandas tables."""
