"""The analysis' figures: one module per family (the per-group curves, the cost), what they share, and the
forked process that draws the per-group figures while the analysis goes on."""
