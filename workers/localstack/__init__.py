"""The real local stack (Kafka KRaft, Redis, `dpstream exporter`, Prometheus, Alertmanager) as child processes
on 127.0.0.1.

Used by `python -m dpstream.workers.localstack up|status|down`, `deploy/local/stack`, the test
fixtures, `dpstream demo` and `dpstream bench`.

A tool that needs a checkout of the repository: Kafka's jars are fetched by deploy/local/pom.xml
and every config comes from deploy/local/templates (`paths.repo_deploy_dir`). This package is not
in the wheel (pyproject's `packages` leaves it out); from an editable install (`pip install -e .`)
it imports as usual. It may import the runtime (topic administration is `runtime.admin`), never the
reverse (tests/unit/test_layering.py).
"""

from __future__ import annotations

from dpstream.workers.localstack.errors import ServiceStartError
from dpstream.workers.localstack.exporter import ExporterHandle
from dpstream.workers.localstack.kafka import KafkaHandle, start_kafka
from dpstream.workers.localstack.monitoring import AlertmanagerHandle, PrometheusHandle
from dpstream.workers.localstack.paths import default_home
from dpstream.workers.localstack.ports import Ports, free_port
from dpstream.workers.localstack.redis import RedisHandle, start_redis
from dpstream.workers.localstack.stack import Service, ServiceStatus, Stack, StackConfig
from dpstream.workers.runtime.admin import create_topics, create_topics_async

__all__ = [
    "AlertmanagerHandle",
    "ExporterHandle",
    "KafkaHandle",
    "Ports",
    "PrometheusHandle",
    "RedisHandle",
    "Service",
    "ServiceStartError",
    "ServiceStatus",
    "Stack",
    "StackConfig",
    "create_topics",
    "create_topics_async",
    "default_home",
    "free_port",
    "start_kafka",
    "start_redis",
]
