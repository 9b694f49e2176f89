"""What the modes cost: the collective counter, the collective floor, and the interleaved cost loop."""
