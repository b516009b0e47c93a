"""`dpstream demo`: the main job on a local stack — a worker and an exporter watched by Prometheus and
Alertmanager, a live synthetic feed, and a table of releases beside the truth only a demo knows.

A tool that needs a checkout of the repository: it brings up Kafka, Redis, Prometheus and Alertmanager
through `dpstream.workers.localstack` (Kafka jars fetched by deploy/local/pom.xml, config templates under
deploy/local/templates, the shipped rules and Alertmanager template under deploy/). This package is not in
the wheel (pyproject's `packages` leaves it out); from an editable install (`pip install -e .`) it imports
as usual, and from a wheel `dpstream demo` says in one line that it needs a checkout. Nothing in the
runtime, pipeline, release, ledger or noise layers imports it (tests/unit/test_layering.py).
"""

from dpstream.workers.demo.run import DemoOptions, run_demo

__all__ = ["DemoOptions", "run_demo"]
