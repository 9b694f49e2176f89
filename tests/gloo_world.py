"""The tests' real gloo worlds: `runner.local_world.run_in_world` (shared with bench/)."""

from runner.local_world import run_in_world

__all__ = ["run_in_world"]
