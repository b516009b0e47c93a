"""A budget command whose ledger cannot be reached says, on one line, which setting named the URL and
what to check (exit 1: the ledger is unavailable, nothing was read or changed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpstream.workers.cli import main
from dpstream.workers.localstack.ports import free_port


def _url() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there


@pytest.mark.parametrize("how", ["flag", "env", "topology"])
def test_an_unreachable_ledger_names_where_its_url_came_from(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _url()
    monkeypatch.delenv("DPSTREAM_REDIS", raising=False)
    argv = ["budget", "status"]
    if how == "flag":
        argv += ["--redis", url]
    elif how == "env":
        monkeypatch.setenv("DPSTREAM_REDIS", url)
    else:
        topology = tmp_path / "t.yaml"
        topology.write_text(
            "version: 1\nsources:\n  s: {topic: t, privacy_unit: u, timestamp: ts}\n"
            "budgets:\n  b: {epsilon: 1.0, accounting: pure, period: 1d}\n"
            "metrics:\n  m: {source: s, budget: b, window: {tumbling: 1h}, aggregate: count, mechanism: laplace}\n"
            f"sinks: {{releases: r, dead_letter: d}}\nredis: {{url: '{url}'}}\n"
        )
        argv += ["--topology", str(topology)]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    named = {"flag": "--redis", "env": "$DPSTREAM_REDIS", "topology": f"redis.url in {tmp_path / 't.yaml'}"}[how]
    assert len(err.splitlines()) == 1 and "LedgerUnavailable" in err and url in err, err
    assert f"check the URL from {named} and that Redis runs there" in err and "$DPSTREAM_REDIS_PASSWORD" in err
    assert ".;" not in err
