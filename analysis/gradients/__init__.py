"""Each run's gradient against its baseline: the comparison groups, the measures, the verdicts, what each mode
should get, and whether a mode's curve changes with the layout."""
