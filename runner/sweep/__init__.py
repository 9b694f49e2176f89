"""The Hydra process: validate every job, spawn its ranks, record how it ended, tally the sweep.

Nothing here imports torch (a test guards it): a sweep's launching process
stays light, and a job that cannot run is refused before any rank starts.
"""
