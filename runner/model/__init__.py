"""Models by architecture (`runner.model.registry`), their FSDP2 sharding and Ulysses sequence parallelism."""
