"""What the modes cost: the interleaved cost loop and the collective floor (the counter both loops use is
`runner.train.counter`)."""
