"""Real trainers' loss reductions, each a `custom.fn` (README "Custom reductions"; `experiment=trainers` runs them).

Each file names, in its header, the upstream file and function whose rule it follows.
"""
