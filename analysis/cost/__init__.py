"""What the modes cost: the interleaved measurement's paired inference (and B1's block bootstrap), and the
collective counts of the training runs."""
