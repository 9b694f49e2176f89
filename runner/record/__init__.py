"""What a job leaves in its directory and how it is read back: config.yaml, metrics.jsonl (and their
fast copies), summary.json, the W&B run. The analysis reads the runner's output through these modules only."""
