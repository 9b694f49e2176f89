"""Real gloo worlds of CPU processes for the tests and the benchmarks."""
