"""One rank's life: its place in the world (the only reader of launcher variables) and the worker that
joins the process group, runs the training or the cost loop, and ends cleanly."""
