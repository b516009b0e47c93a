"""The Kafka and Faust runtime: the worker app, batch ingest, the release side, topics, settings."""
