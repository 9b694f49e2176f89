"""The tests' real gloo worlds: `runner.testing.local_world.run_in_world` (shared with bench/)."""

from runner.testing.local_world import run_in_world

__all__ = ["run_in_world"]
