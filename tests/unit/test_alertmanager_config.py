"""The Alertmanager config: rendered from its template, checked by amtool, routed and inhibited as DESIGN §7 says.

Only files and external tools are used here (render.sh, amtool, and Alertmanager itself for the live
inhibition check): no project module is imported.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.debian_tools import debian_tool

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
AM_DIR = ROOT / "deploy" / "alertmanager"
TEMPLATE = AM_DIR / "alertmanager.yml.tmpl"
RENDER = AM_DIR / "render.sh"
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
URLS = {
    "DPSTREAM_PAGER_URL": "http://127.0.0.1:9/pager?token=a&b=c",
    "DPSTREAM_TICKET_URL": "https://127.0.0.1:9/ticket",
}
BUDGET_ALERTS_SILENCED_BY_EXHAUSTION = (
    "DPBudgetWarning",
    "DPBudgetBurnRateHigh",
    "DPBudgetBurnRateElevated",
    "DPBudgetProjectedExhaustion",
    "DPBreakerOpen",
)


@pytest.fixture(scope="module")
def amtool() -> str:
    """amtool, from Debian's `prometheus-alertmanager` package."""
    return debian_tool("amtool", "prometheus-alertmanager", "the stack installs it with `up alertmanager`")


def _render(output: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in URLS}
    return subprocess.run(
        ["sh", str(RENDER), str(TEMPLATE), str(output)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.fixture(scope="module")
def rendered(amtool: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """alertmanager.yml rendered from the template with example URLs (amtool is on PATH, so render.sh checks it)."""
    output = tmp_path_factory.mktemp("alertmanager") / "alertmanager.yml"
    result = _render(output, URLS)
    assert result.returncode == 0, result.stdout + result.stderr
    return output


def _config(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _alert_severities() -> dict[str, str]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return {r["alert"]: r["labels"]["severity"] for g in doc["groups"] for r in g["rules"] if "alert" in r}


# --- render step ----------------------------------------------------------------------------------------


def test_rendered_config_passes_amtool(amtool: str, rendered: Path) -> None:
    """`amtool check-config` accepts the rendered file."""
    result = subprocess.run([amtool, "check-config", str(rendered)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_render_substitutes_urls_verbatim_and_keeps_them_private(rendered: Path) -> None:
    """The receivers get the env URLs byte for byte (& and ? included); the file is readable by its owner only."""
    config = _config(rendered)
    urls = {r["name"]: r["webhook_configs"][0]["url"] for r in config["receivers"]}
    assert urls == {"pager": URLS["DPSTREAM_PAGER_URL"], "ticket": URLS["DPSTREAM_TICKET_URL"]}
    assert "${" not in rendered.read_text(encoding="utf-8")
    assert rendered.stat().st_mode & 0o077 == 0


def test_template_urls_are_placeholders_only() -> None:
    """The committed template holds no webhook URL, only the two placeholders."""
    config = _config(TEMPLATE)
    urls = {r["name"]: r["webhook_configs"][0]["url"] for r in config["receivers"]}
    assert urls == {"pager": "${DPSTREAM_PAGER_URL}", "ticket": "${DPSTREAM_TICKET_URL}"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DPSTREAM_TICKET_URL": "https://t.example/x"}, "DPSTREAM_PAGER_URL is not set"),
        ({**URLS, "DPSTREAM_TICKET_URL": ""}, "DPSTREAM_TICKET_URL is not set"),
        ({**URLS, "DPSTREAM_PAGER_URL": "pager.example/x"}, "not an http(s) URL"),
        ({**URLS, "DPSTREAM_PAGER_URL": "https://p.example/x' y"}, "contains a quote or whitespace"),
    ],
)
def test_render_refuses_bad_environment(tmp_path: Path, env: dict[str, str], message: str) -> None:
    """An unset, empty, non-URL or quote-holding value is refused with exit 2 and no file is written."""
    output = tmp_path / "alertmanager.yml"
    result = _render(output, env)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not output.exists()


# --- routing --------------------------------------------------------------------------------------------


def _routes_to(amtool: str, config: Path, labels: dict[str, str]) -> str:
    argv = [amtool, "config", "routes", "test", f"--config.file={config}", *(f"{k}={v}" for k, v in labels.items())]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        ({"alertname": "DPBudgetExhausted", "scope": "web-daily", "severity": "critical"}, "pager"),
        ({"alertname": "DPBudgetWarning", "scope": "web-daily", "severity": "warning"}, "ticket"),
        ({"alertname": "SomethingElse"}, "ticket"),
    ],
)
def test_severity_routes(amtool: str, rendered: Path, labels: dict[str, str], receiver: str) -> None:
    """critical pages, warning opens a ticket, an alert without severity still reaches a human by ticket."""
    assert _routes_to(amtool, rendered, labels) == receiver


def test_every_alert_rule_routes_by_its_severity(amtool: str, rendered: Path) -> None:
    """Each alert in rules.yml reaches pager if critical, ticket if warning."""
    for alert, severity in _alert_severities().items():
        expected = {"critical": "pager", "warning": "ticket"}[severity]
        assert _routes_to(amtool, rendered, {"alertname": alert, "scope": "s", "severity": severity}) == expected, alert


def test_grouping_by_alert_and_scope(rendered: Path) -> None:
    """Notifications are grouped per alert name and budget scope."""
    assert _config(rendered)["route"]["group_by"] == ["alertname", "scope"]


# --- inhibition ------------------------------------------------------------------------------------------


def test_exhaustion_inhibits_the_scope_budget_alerts(rendered: Path) -> None:
    """DPBudgetExhausted silences DPBudgetWarning, DPBudgetBurnRate* and its other budget alerts of the same scope."""
    rules = _config(rendered)["inhibit_rules"]
    exhausted = [r for r in rules if r["source_matchers"] == ['alertname="DPBudgetExhausted"']]
    assert len(exhausted) == 1
    rule = exhausted[0]
    assert rule["equal"] == ["scope"]
    (target,) = rule["target_matchers"]
    assert target.startswith('alertname=~"') and target.endswith('"')
    assert set(target[len('alertname=~"') : -1].split("|")) == set(BUDGET_ALERTS_SILENCED_BY_EXHAUSTION)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _http(url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"}, method="GET" if body is None else "POST"
    )
    with urllib.request.urlopen(request, timeout=2) as response:  # loopback only
        raw = response.read()
    return json.loads(raw) if raw else None


@pytest.fixture()
def alertmanager(rendered: Path, amtool: str, tmp_path: Path) -> Iterator[str]:
    """A real Alertmanager on a free loopback port with the rendered config (clustering off); its base URL."""
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        pytest.skip("alertmanager not installed (the stack installs it with `up alertmanager`)")
    port = _free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={rendered}",
            f"--storage.path={tmp_path / 'storage'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=1).close()  # loopback only
                break
            except (urllib.error.URLError, OSError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"alertmanager did not start: {proc.stderr.read() if proc.stderr else ''}")
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_inhibition_live(alertmanager: str) -> None:
    """In a running Alertmanager, DPBudgetExhausted of scope a silences a's warning and burn alerts, not scope b's."""

    def alert(name: str, scope: str, severity: str) -> dict[str, Any]:
        return {"labels": {"alertname": name, "scope": scope, "severity": severity, "currency": "rho"}}

    _http(
        f"{alertmanager}/api/v2/alerts",
        [
            alert("DPBudgetExhausted", "a", "critical"),
            alert("DPBudgetWarning", "a", "warning"),
            alert("DPBudgetBurnRateHigh", "a", "critical"),
            alert("DPBudgetBurnRateElevated", "a", "warning"),
            alert("DPBudgetWarning", "b", "warning"),
            alert("DPReleaseLag", "a", "critical"),
        ],
    )
    expected = {
        ("DPBudgetExhausted", "a"): False,
        ("DPBudgetWarning", "a"): True,
        ("DPBudgetBurnRateHigh", "a"): True,
        ("DPBudgetBurnRateElevated", "a"): True,
        ("DPBudgetWarning", "b"): False,
        ("DPReleaseLag", "a"): False,
    }
    deadline = time.monotonic() + 15
    while True:
        got = {
            (a["labels"]["alertname"], a["labels"]["scope"]): bool(a["status"]["inhibitedBy"])
            for a in _http(f"{alertmanager}/api/v2/alerts")
        }
        if got == expected or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert got == expected
