"""The training side of a rank: the parts both loops build, the loss reductions, the collective counter, the optimizer, the training loop."""
