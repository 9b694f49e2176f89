"""What the post-training runs (objective=pg) show: each mode against itself at W=1 and against the papers."""
