"""Benchmarks (`dpstream bench …`); one module per target, each exposes `register(subparsers)`.

A tool that needs a checkout of the repository: `bench pipeline` and `bench ledger` start Kafka and
Redis through `dpstream.workers.localstack` (Kafka jars fetched by deploy/local/pom.xml, config
templates under deploy/local/templates). This package is not in the wheel (pyproject's
`packages` leaves it out); from an editable install (`pip install -e .`) it imports as usual, and
from a wheel `dpstream bench` says in one line that it needs a checkout. Nothing in the runtime,
pipeline, release, ledger or noise layers imports it (tests/unit/test_layering.py).
"""
