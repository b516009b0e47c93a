"""The worker's web port serves none of Faust's built-in views and listens on loopback (DESIGN §1 "Trust boundary").

Faust's default views would serve `GET /table/dpstream-mergers/<metric>/`, the un-noised merger state, on
0.0.0.0. The unit tests check the app's settings and route an in-process server (no broker); the e2e test
runs a real `dpstream worker --web-port` that has released windows and asks its port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import faust
import pytest

from dpstream.workers.localstack import free_port
from dpstream.workers.runtime.app import new_app, web_settings
from dpstream.workers.runtime.settings import RuntimeSettings
from tests.e2e.harness import Deployment, deploy, event, poll, releases, send

METRIC = "views"
TABLE = "dpstream-mergers"
BUILTIN_PATHS = [
    "/table/",
    f"/table/{TABLE}/",
    f"/table/{TABLE}/{METRIC}/",
    "/router/",
    f"/router/{TABLE}/get/?key={METRIC}",
    "/stats/",
    "/graph/",
    "/assignment/",
    "/performance/",
]
VIEW_FLAGS = [
    "web_tables_enabled",
    "web_router_enabled",
    "web_stats_enabled",
    "web_graph_enabled",
    "web_metrics_enabled",
]


def _settings(**kwargs: Any) -> RuntimeSettings:
    return RuntimeSettings(bootstrap="127.0.0.1:1", redis_url="redis://127.0.0.1:1/0", **kwargs)


async def _serve(app: faust.App, paths: list[str]) -> dict[str, tuple[int, str]]:
    """GET each path from the app's aiohttp application on an in-process test server."""
    from aiohttp.test_utils import TestClient, TestServer

    app.web.init_server()
    out: dict[str, tuple[int, str]] = {}
    async with TestClient(TestServer(app.web.web_app)) as client:
        for path in paths:
            resp = await client.get(path)
            out[path] = (resp.status, await resp.text())
    return out


# ---- unit level: no broker --------------------------------------------------------------------------


@pytest.mark.unit  # pure: no broker; kept beside the e2e test of the same port
def test_worker_settings_default_to_loopback() -> None:
    """RuntimeSettings and the CLI default bind the port to 127.0.0.1."""
    from dpstream.workers.cli import build_parser

    assert _settings().web_bind == "127.0.0.1"
    args = build_parser().parse_args(["worker", "t.yaml", "--web-port", "7000"])
    assert args.web_bind == "127.0.0.1"
    args = build_parser().parse_args(["worker", "t.yaml", "--web-port", "7000", "--web-bind", "10.0.0.5"])
    assert args.web_bind == "10.0.0.5"


@pytest.mark.unit  # pure: no broker; kept beside the e2e test of the same port
def test_web_settings_turn_every_builtin_view_off_and_bind() -> None:
    web = web_settings(_settings(web_port=7001, web_bind="10.1.2.3"))
    assert web["web_enabled"] is True and web["web_port"] == 7001 and web["web_bind"] == "10.1.2.3"
    assert all(web[flag] is False for flag in VIEW_FLAGS)
    assert web_settings(_settings())["web_enabled"] is False  # no --web-port, no server


@pytest.mark.unit  # pure: no broker; kept beside the e2e test of the same port
def test_environment_cannot_reopen_views_or_widen_the_bind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Faust lets WEB_BIND / APP_WEB_*_ENABLED override keyword settings; the worker's app pins its own."""
    for flag in VIEW_FLAGS:
        monkeypatch.setenv(f"APP_{flag.upper()}", "true")
    monkeypatch.setenv("APP_DEBUG", "true")
    monkeypatch.setenv("WEB_BIND", "0.0.0.0")
    monkeypatch.setenv("APP_WEB_ENABLED", "true")
    app = new_app("dpstream-web-unit-env", _settings())
    assert app.conf.web_bind == "127.0.0.1"
    assert app.conf.web_enabled is False
    assert all(getattr(app.conf, flag) is False for flag in VIEW_FLAGS)
    app = new_app("dpstream-web-unit-env2", _settings(web_port=7002))
    assert app.conf.web_enabled is True and app.conf.web_port == 7002 and app.conf.web_bind == "127.0.0.1"


@pytest.mark.unit  # pure: no broker; kept beside the e2e test of the same port
def test_app_routes_no_builtin_view_but_serves_added_pages() -> None:
    """With a merger table defined, every built-in path is 404; a page the app adds is served."""
    control = faust.App("dpstream-web-unit-control", broker="kafka://127.0.0.1:1", store="memory://")
    control.Table(TABLE, default=None)
    leaked = asyncio.run(_serve(control, ["/table/", f"/table/{TABLE}/"]))
    assert all(status == 200 for status, _ in leaked.values()), leaked  # the paths asked below are the real ones

    app = new_app("dpstream-web-unit", _settings(web_port=7003))
    app.Table(TABLE, default=None)

    @app.page("/health")
    async def health(web, request):  # a later change adds the real one
        return web.json({"ok": True})

    got = asyncio.run(_serve(app, [*BUILTIN_PATHS, "/health", "/"]))
    for path in BUILTIN_PATHS:
        assert got[path][0] == 404, (path, got[path])
    assert got["/health"][0] == 200 and json.loads(got["/health"][1]) == {"ok": True}
    assert got["/"][0] == 200 and json.loads(got["/"][1]) == {"status": "OK"}  # Faust's plain index, no stats


# ---- end to end: a real worker on the local stack ---------------------------------------------------


@pytest.fixture
def deployment(tmp_path: Path, kafka_broker, fresh_redis):
    dep = deploy(tmp_path, kafka_broker.bootstrap, fresh_redis.url)
    yield dep
    dep.stop_all()


def _start_worker(dep: Deployment, name: str, extra: list[str]) -> subprocess.Popen:
    log = open(dep.path.parent / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
    argv = [
        sys.executable,
        "-m",
        "dpstream.workers.cli",
        "worker",
        str(dep.path),
        "--bootstrap",
        dep.bootstrap,
        "--redis",
        dep.redis_url,
        "--worker-id",
        name,
        *extra,
    ]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    dep.workers.append(proc)
    return proc


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _listeners(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} writes them) of sockets listening on `port`."""
    found = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            addr, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == "0A":  # 0A = TCP_LISTEN
                found.append(addr)
    return found


def _non_loopback_addresses() -> list[str]:
    addrs: set[str] = set()
    with contextlib.suppress(OSError):
        addrs.update(info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET))
    try:  # the address of the default route's interface (UDP connect sends nothing)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))
            addrs.add(probe.getsockname()[0])
    except OSError:
        pass
    return sorted(a for a in addrs if not a.startswith("127.") and a != "0.0.0.0")


@pytest.mark.e2e
def test_worker_web_port_serves_no_table_and_listens_on_loopback(deployment: Deployment) -> None:
    """After windows were released (the merger table holds state), no built-in view answers and the port is
    reachable on 127.0.0.1 only."""
    port = free_port()
    proc = _start_worker(deployment, "w-web", ["--web-port", str(port)])
    assert poll(lambda: _accepts("127.0.0.1", port), timeout_s=60), deployment.log("w-web")[-3000:]

    def views_released(start: int | None = None) -> list[dict]:
        return [
            r
            for r in releases(deployment.bootstrap, deployment.topology.sinks.releases)
            if r["metric"] == METRIC and (start is None or r["window"]["start_epoch"] == start)
        ]

    # The worker runs its public schedule; once it releases, send events into the current window and wait
    # for that window's release, so the merger table holds a true, non-empty aggregate when we ask for it.
    assert poll(views_released, timeout_s=120), deployment.log("w-web")[-3000:]
    now = time.time()
    window = int(now) // 2 * 2
    send(deployment.bootstrap, deployment.source_topic, [event(f"u{i}", now) for i in range(30)])
    assert poll(lambda: views_released(window), timeout_s=120), deployment.log("w-web")[-3000:]

    for path in BUILTIN_PATHS:
        status, body = _get(port, path)
        assert status == 404, (path, status, body[:300])
    status, body = _get(port, "/")
    assert status == 200 and json.loads(body) == {"status": "OK"}  # Faust's plain index, no statistics

    assert _listeners(port) == ["0100007F"], _listeners(port)  # 127.0.0.1, IPv4 only
    for addr in _non_loopback_addresses():
        assert not _accepts(addr, port), f"web port {port} answers on {addr}"
    assert proc.poll() is None
