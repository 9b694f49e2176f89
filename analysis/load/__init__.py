"""A sweep's records into DataFrames: the runs and their steps, each run's identity (id, mode label), runs.parquet."""
