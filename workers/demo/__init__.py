"""`dpstream demo`: the main job on a local stack — a worker, a synthetic feed and a live table of releases.

A tool that needs a checkout of the repository: it brings up Kafka and Redis through
`dpstream.workers.localstack` (Kafka jars fetched by deploy/local/pom.xml, config templates under
deploy/local/templates). This package is not in the wheel (pyproject's `packages` leaves it out);
from an editable install (`pip install -e .`) it imports as usual, and from a wheel `dpstream demo`
says in one line that it needs a checkout. Nothing in the runtime, pipeline, release, ledger or
noise layers imports it (tests/unit/test_layering.py).
"""

from dpstream.workers.demo.run import DemoOptions, run_demo

__all__ = ["DemoOptions", "run_demo"]
