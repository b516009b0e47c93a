"""The demo's monitoring: Prometheus and Alertmanager configs for one run, what Prometheus sees, and a
webhook receiver that prints what Alertmanager sends.

Prometheus scrapes the demo's worker (`dpstream-worker`) and its `dpstream exporter` (`dpstream-exporter`)
every 5 s and evaluates the shipped rules (deploy/prometheus/rules.yml; those job names are what the
availability alerts select). Alertmanager runs the shipped routing (deploy/alertmanager/alertmanager.yml.tmpl,
rendered by its render.sh) with both receivers, pager and ticket, pointing at the demo's own webhook, so a
notification is printed instead of paging anyone.

This Prometheus stands for a dashboard with a wide audience, so the demo's worker runs without
`--curator-metrics`: it and the exporter serve data-independent metrics only (budget, breaker, plan,
info, the released noise σ). The alerts on curator-only series (DPReleaseLag, DPReleasesRefused,
DPReleasesParked) therefore stay silent in the demo; the budget alerts work as in production.
"""

from __future__ import annotations

__all__ = [
    "RATIO_QUERY",
    "PromView",
    "WebhookReceiver",
    "alert_rules_path",
    "alertmanager_template_path",
    "budget_graph_url",
    "feed_query",
    "prometheus_view",
    "render_alertmanager_config",
    "render_prometheus_config",
]

import asyncio
import shutil
import subprocess
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpstream.topology.model import Topology
from dpstream.workers.localstack.paths import repo_deploy_dir, template_path

RATIO_QUERY = "dpstream_budget_spent_ratio"
"""The budget ratio as every target serves it (worker and exporter; the rules reduce with max by scope)."""

_HOST = "127.0.0.1"


def alert_rules_path() -> Path | None:
    """deploy/prometheus/rules.yml of this checkout, if it is there."""
    path = repo_deploy_dir().parent / "prometheus" / "rules.yml"
    return path if path.is_file() else None


def alertmanager_template_path() -> Path | None:
    """deploy/alertmanager/alertmanager.yml.tmpl of this checkout, if it is there."""
    path = repo_deploy_dir().parent / "alertmanager" / "alertmanager.yml.tmpl"
    return path if path.is_file() else None


def render_prometheus_config(
    prometheus_port: int, alertmanager_port: int, worker_port: int, exporter_port: int, rules: Path | None
) -> str:
    """prometheus.yml of one demo run: 5 s scrapes and evaluations, the shipped rules, the local Alertmanager."""
    rule_files = f"rule_files:\n  - {rules}\n" if rules is not None else "rule_files: []\n"
    return (
        "# Written by `dpstream demo` for this run (deploy/prometheus/prometheus.yml is the sample for deployments).\n"
        "# 5 s scrapes so a one-minute demo sees its budget move; the shipped rules' windows stay as they are.\n"
        "global:\n  scrape_interval: 5s\n  evaluation_interval: 5s\n"
        f"{rule_files}"
        "alerting:\n  alertmanagers:\n    - static_configs:\n"
        f'        - targets: ["{_HOST}:{alertmanager_port}"]\n'
        "scrape_configs:\n"
        f'  - job_name: dpstream-worker\n    static_configs:\n      - targets: ["{_HOST}:{worker_port}"]\n'
        f'  - job_name: dpstream-exporter\n    static_configs:\n      - targets: ["{_HOST}:{exporter_port}"]\n'
        f'  - job_name: prometheus\n    static_configs:\n      - targets: ["{_HOST}:{prometheus_port}"]\n'
    )


def render_alertmanager_config(output: Path, webhook_port: int) -> bool:
    """Render the shipped Alertmanager template with both receivers at the demo's webhook; True if the
    shipped template was used, False if it is missing and the local stack's plain default was copied."""
    template = alertmanager_template_path()
    if template is None:
        shutil.copyfile(template_path("alertmanager.yml"), output)
        return False
    env = {
        "DPSTREAM_PAGER_URL": f"http://{_HOST}:{webhook_port}/pager",
        "DPSTREAM_TICKET_URL": f"http://{_HOST}:{webhook_port}/ticket",
        "PATH": _path_env(),
    }
    result = subprocess.run(
        ["sh", str(template.parent / "render.sh"), str(template), str(output)],  # noqa: S603,S607
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        from dpstream.topology.errors import ConfigError

        reason = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["failed"]
        raise ConfigError(f"{template}: render.sh failed: {reason[0]}: fix the template and run again")
    return True


def _path_env() -> str:
    import os

    return os.environ.get("PATH", "/usr/bin:/bin")


FEED_FAMILY = "dpstream_release_value"
"""The feed's value series (served by `dpstream exporter` from the releases topic)."""


def feed_query(topology: Topology) -> str | None:
    """The Grafana-ready PromQL of one feed series: the first metric (file order) of a value aggregate
    whose keys are bounded, on its first declared key ('' for an ungrouped metric); None when there is none."""
    from dpstream.topology.model import Aggregate
    from dpstream.workers.feed import key_bound_refusal

    valued = (Aggregate.COUNT, Aggregate.COUNT_UNITS, Aggregate.SUM, Aggregate.MEAN)
    for metric in topology.metrics.values():
        if metric.aggregate not in valued or key_bound_refusal(metric) is not None:
            continue
        key = metric.keys[0] if metric.keys else ""
        return f'{FEED_FAMILY}{{metric="{metric.name}",key="{key}"}}'
    return None


def budget_graph_url(prometheus_url: str, query: str = RATIO_QUERY) -> str:
    """The Prometheus graph page of `query` over the last 15 minutes."""
    params = urllib.parse.urlencode({"g0.expr": query, "g0.tab": "0", "g0.range_input": "15m"})
    return f"{prometheus_url}/graph?{params}"


@dataclass(frozen=True)
class PromView:
    """What Prometheus sees right now: the budget ratio per scope, its targets, its active alerts."""

    ratios: dict[str, float] = field(default_factory=dict)
    targets_up: int = 0
    targets: int = 0
    alerts: tuple[tuple[str, str, str], ...] = ()
    """(alertname, state pending|firing, scope or '') per active alert."""
    error: str | None = None
    feed_series: int = 0
    """How many `dpstream_release_value` series Prometheus holds (the exporter's feed)."""

    def line(self) -> str:
        """`Prometheus: ratio … | 2/2 dpstream targets up | alerts: …` (or why it could not ask)."""
        if self.error:
            return f"  Prometheus: not answering ({self.error})"
        ratio = ", ".join(f"{scope} {100 * r:.2f} %" for scope, r in sorted(self.ratios.items())) or "no sample yet"
        firing = [f"{name}{f' ({scope})' if scope else ''}" for name, state, scope in self.alerts if state == "firing"]
        pending = [name for name, state, _ in self.alerts if state == "pending"]
        alerts = "firing: " + ", ".join(firing) if firing else "none firing"
        if pending:
            alerts += f" (pending: {', '.join(sorted(set(pending)))})"
        return (
            f"  Prometheus: {RATIO_QUERY} {ratio} | {self.targets_up}/{self.targets} dpstream targets up "
            f"| alerts: {alerts} | feed: {self.feed_series} {FEED_FAMILY} series"
        )


async def prometheus_view(session: Any, prometheus_url: str) -> PromView:
    """Ask Prometheus' HTTP API for the ratio, the dpstream targets' `up` and /api/v1/alerts."""
    try:
        ratio = await _query(session, prometheus_url, f"max by (scope) ({RATIO_QUERY})")
        up = await _query(session, prometheus_url, 'up{job=~"dpstream-.*"}')
        feed = await _query(session, prometheus_url, FEED_FAMILY)
        async with session.get(f"{prometheus_url}/api/v1/alerts") as response:
            alerts_doc = await response.json()
    except Exception as exc:  # noqa: BLE001 - a view for the screen: say why, carry on
        return PromView(error=type(exc).__name__)
    alerts = tuple(
        (a["labels"].get("alertname", "?"), a.get("state", "?"), a["labels"].get("scope", ""))
        for a in alerts_doc.get("data", {}).get("alerts", [])
    )
    return PromView(
        ratios={r["metric"].get("scope", "?"): float(r["value"][1]) for r in ratio},
        targets_up=sum(float(r["value"][1]) == 1.0 for r in up),
        targets=len(up),
        alerts=alerts,
        feed_series=len(feed),
    )


async def _query(session: Any, prometheus_url: str, query: str) -> list[dict[str, Any]]:
    async with session.get(f"{prometheus_url}/api/v1/query", params={"query": query}) as response:
        doc = await response.json()
    return list(doc.get("data", {}).get("result", []))


class WebhookReceiver:
    """An HTTP endpoint for Alertmanager's webhooks (/pager, /ticket) that hands each alert to `on_alert`."""

    def __init__(self, port: int, on_alert: Callable[[str, str, str, str], None]) -> None:
        """`on_alert(receiver, status, alertname, scope)` is called per alert of each notification."""
        self.port = port
        self._on_alert = on_alert
        self._runner: Any = None
        self.received = 0

    async def start(self) -> None:
        """Listen on 127.0.0.1:port."""
        from aiohttp import web

        async def hook(request: web.Request) -> web.Response:
            receiver = request.match_info["receiver"]
            doc = await request.json()
            for alert in doc.get("alerts", []):
                labels = alert.get("labels", {})
                self.received += 1
                self._on_alert(
                    receiver, alert.get("status", "?"), labels.get("alertname", "?"), labels.get("scope", "")
                )
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_post("/{receiver}", hook)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, _HOST, self.port).start()

    async def stop(self) -> None:
        """Close the listener."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            await asyncio.sleep(0)
