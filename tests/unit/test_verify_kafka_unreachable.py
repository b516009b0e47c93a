"""`verify` that cannot read Kafka says where the address came from and which protocol it spoke, so a
security mismatch (a SASL user against a PLAINTEXT listener) is not read as a wrong address."""

from __future__ import annotations

import asyncio

import pytest

from dpstream.topology.errors import ConfigError
from dpstream.workers.localstack.ports import free_port
from dpstream.workers.runtime.kafka_security import KafkaSecurity, Protocol, Secret
from dpstream.workers.verify.sources import read_topic


@pytest.mark.parametrize("protocol", [Protocol.PLAINTEXT, Protocol.SASL_PLAINTEXT])
def test_an_unreadable_kafka_is_one_line_naming_the_address_sources_and_protocol(protocol: Protocol) -> None:
    bootstrap = f"127.0.0.1:{free_port()}"  # nothing listens there
    security = (
        KafkaSecurity(protocol=protocol, username="dpstream", password=Secret("not-printed"))
        if protocol.sasl
        else KafkaSecurity(protocol=protocol)
    )
    with pytest.raises(ConfigError) as caught:
        asyncio.run(read_topic(bootstrap, "releases", timeout_s=5.0, security=security))
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and f"Kafka at {bootstrap} over {protocol.value}" in message
    assert "--bootstrap, else $DPSTREAM_KAFKA, else the topology's kafka.bootstrap" in message
    assert "DPSTREAM_KAFKA_SECURITY_PROTOCOL" in message and "not-printed" not in message
