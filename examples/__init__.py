"""Examples that run with the runner (`custom.fn=examples.reductions.<trainer>:loss`, from the repository root)."""
