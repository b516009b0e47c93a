"""The dpstream runtime: Kafka workers, noise sampling, the Redis budget ledger, metrics and the CLI."""
