"""Helpers of tests/e2e/test_monitoring_e2e.py: the test's own Prometheus / Alertmanager configs built from the
shipped files, a webhook receiver, small HTTP clients, dashboard-query and runbook-command extraction, and the
`dpstream` subprocesses (worker, exporter, CLI).

Only the speed of the shipped monitoring changes, by one documented transformation (`SPEEDUP`):
- deploy/prometheus/rules.yml is loaded as a copy in which ONLY the `for:` durations are divided by SPEEDUP
  (`fast_rules` checks that the copy equals the shipped file once `for:` is put back);
- the Alertmanager config is the shipped template rendered by deploy/alertmanager/render.sh, and in the rendered
  file ONLY `group_wait` and `group_interval` are divided by SPEEDUP (`render_alertmanager` checks the same way).
Everything else (expressions, labels, annotations, routes, receivers, inhibition, repeat intervals) is shipped.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yml"
AM_TEMPLATE = DEPLOY / "alertmanager" / "alertmanager.yml.tmpl"
RENDER_SH = DEPLOY / "alertmanager" / "render.sh"
DASHBOARDS = DEPLOY / "grafana" / "dashboards"
RUNBOOKS = DEPLOY / "runbooks"
HOST = "127.0.0.1"

SPEEDUP = 20
"""The one factor by which the test's copies shorten the shipped `for:` (rules.yml) and `group_wait` /
`group_interval` (Alertmanager): 1m -> 3s, 2m -> 6s, 30s -> 1.5s, 10s -> 500ms, 5m -> 15s."""


# ---- durations ------------------------------------------------------------------------------------

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000, "y": 31_536_000_000}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")


def duration_ms(text: str) -> int:
    """A Prometheus/Alertmanager duration (`1m`, `1h30m`, `500ms`) in milliseconds."""
    text = text.strip().strip("'\"")
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return sum(int(n) * _UNIT_MS[u] for n, u in parts)


def format_ms(ms: int) -> str:
    """Milliseconds as the shortest exact duration (`3s`, `1500ms`)."""
    for unit in ("h", "m", "s"):
        if ms % _UNIT_MS[unit] == 0:
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{ms}ms"


def shorten(text: str, factor: int = SPEEDUP) -> str:
    """`text` divided by `factor`, at least 1 ms."""
    return format_ms(max(1, duration_ms(text) // factor))


def _shorten_keys(text: str, keys: tuple[str, ...], factor: int) -> tuple[str, dict[str, str]]:
    """Rewrite the value of every `key: <duration>` line whose key is in `keys`; returns the text and the
    changes (original -> shortened)."""
    changes: dict[str, str] = {}
    pattern = re.compile(rf"^(\s*(?:- )?(?:{'|'.join(keys)}):\s*)(\S+)(\s*(?:#.*)?)$")

    def repl(match: re.Match[str]) -> str:
        new = shorten(match.group(2), factor)
        changes[match.group(2)] = new
        return f"{match.group(1)}{new}{match.group(3)}"

    return "\n".join(pattern.sub(repl, line) for line in text.split("\n")), changes


def _strip_keys(node: Any, keys: tuple[str, ...]) -> Any:
    if isinstance(node, dict):
        return {k: _strip_keys(v, keys) for k, v in node.items() if k not in keys}
    if isinstance(node, list):
        return [_strip_keys(v, keys) for v in node]
    return node


def fast_rules(dest: Path, factor: int = SPEEDUP) -> Path:
    """A copy of the shipped rules.yml with only its `for:` durations divided by `factor`."""
    shipped = RULES.read_text(encoding="utf-8")
    text, changes = _shorten_keys(shipped, ("for",), factor)
    assert changes, "rules.yml has no `for:` to shorten"
    assert _strip_keys(yaml.safe_load(text), ("for",)) == _strip_keys(yaml.safe_load(shipped), ("for",)), (
        "the transformation changed more than `for:`"
    )
    dest.write_text(text, encoding="utf-8")
    return dest


def render_alertmanager(dest: Path, pager_url: str, ticket_url: str, factor: int = SPEEDUP) -> Path:
    """The shipped template rendered by the shipped render.sh, then only group_wait/group_interval shortened."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "DPSTREAM_PAGER_URL": pager_url,
        "DPSTREAM_TICKET_URL": ticket_url,
    }
    done = subprocess.run(
        ["sh", str(RENDER_SH), str(AM_TEMPLATE), str(dest)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"render.sh failed ({done.returncode}): {done.stdout}{done.stderr}"
    rendered = dest.read_text(encoding="utf-8")
    assert pager_url in rendered and ticket_url in rendered and "${" not in rendered.split("#", 1)[0]
    text, changes = _shorten_keys(rendered, ("group_wait", "group_interval"), factor)
    assert changes, "the Alertmanager config has no group_wait/group_interval to shorten"
    keys = ("group_wait", "group_interval")
    assert _strip_keys(yaml.safe_load(text), keys) == _strip_keys(yaml.safe_load(rendered), keys)
    dest.write_text(text, encoding="utf-8")
    return dest


def am_durations(path: Path) -> dict[str, int]:
    """The largest group_wait and group_interval (ms) anywhere in an Alertmanager config."""
    out = {"group_wait": 0, "group_interval": 0}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k in out:
                    out[k] = max(out[k], duration_ms(str(v)))
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(yaml.safe_load(path.read_text(encoding="utf-8")))
    return out


def prometheus_config(rules: Path, alertmanager_port: int, worker_port: int, exporter_port: int) -> str:
    """The test's prometheus.yml: 1 s scrapes and evaluations, the two dpstream jobs, the test's Alertmanager."""
    return (
        "# Written by tests/e2e/test_monitoring_e2e.py: 1 s scrapes and rule evaluations; the rules are the shipped\n"
        "# deploy/prometheus/rules.yml with only `for:` shortened (tests/e2e/_monitoring.py, SPEEDUP).\n"
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {rules}\n"
        "alerting:\n  alertmanagers:\n    - static_configs:\n"
        f'        - targets: ["{HOST}:{alertmanager_port}"]\n'
        "scrape_configs:\n"
        f'  - job_name: dpstream-worker\n    static_configs:\n      - targets: ["{HOST}:{worker_port}"]\n'
        f'  - job_name: dpstream-exporter\n    static_configs:\n      - targets: ["{HOST}:{exporter_port}"]\n'
    )


# ---- HTTP -----------------------------------------------------------------------------------------


def http_get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback only
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except OSError:
        return 0, b""


def get_json(url: str, timeout: float = 10.0) -> Any:
    status, body = http_get(url, timeout)
    if status != 200:
        raise AssertionError(f"GET {url}: HTTP {status}: {body[:300]!r}")
    return json.loads(body)


class Prometheus:
    """The bits of the Prometheus HTTP API the tests use."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; raises AssertionError (with Prometheus' error) when the query is rejected."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        status, body = http_get(url)
        doc = json.loads(body) if body else {}
        if status != 200 or doc.get("status") != "success":
            raise AssertionError(f"query rejected (HTTP {status}): {doc.get('error', body[:300])}")
        return list(doc["data"]["result"])

    def label_values(self, label: str, match: str) -> list[str]:
        url = f"{self.url}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": match})
        return list(get_json(url)["data"])

    def alerts(self) -> list[dict[str, Any]]:
        return list(get_json(f"{self.url}/api/v1/alerts")["data"]["alerts"])


class Alertmanager:
    """The bits of the Alertmanager v2 API the tests use."""

    def __init__(self, url: str) -> None:
        self.url = url

    def alerts(self, **labels: str) -> list[dict[str, Any]]:
        """Alerts (active, suppressed, unprocessed) whose labels match `labels` exactly."""
        query = urllib.parse.urlencode([("filter", f'{k}="{v}"') for k, v in labels.items()])
        return list(get_json(f"{self.url}/api/v2/alerts?{query}"))


# ---- webhook receiver -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Notification:
    """One alert of one webhook notification, as Alertmanager sent it."""

    path: str
    """The receiver URL's path: /pager or /ticket."""
    received: float
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]
    fingerprint: str
    group_key: str

    @property
    def alertname(self) -> str:
        return self.labels.get("alertname", "")


class WebhookReceiver:
    """Alertmanager's webhook endpoint inside the test: every POST is kept, per alert, with its path."""

    def __init__(self) -> None:
        self.notifications: list[Notification] = []
        self.raw: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    doc = json.loads(body)
                except ValueError:
                    doc = {"unparsable": body.decode(errors="replace")}
                receiver._keep(self.path, doc)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer((HOST, 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def url(self, path: str) -> str:
        return f"http://{HOST}:{self.port}{path}"

    def _keep(self, path: str, doc: dict[str, Any]) -> None:
        now = time.time()
        with self._lock:
            self.raw.append((path, doc))
            for alert in doc.get("alerts", []):
                self.notifications.append(
                    Notification(
                        path=path,
                        received=now,
                        status=str(alert.get("status")),
                        labels=dict(alert.get("labels", {})),
                        annotations=dict(alert.get("annotations", {})),
                        fingerprint=str(alert.get("fingerprint", "")),
                        group_key=str(doc.get("groupKey", "")),
                    )
                )

    def received(self, alertname: str | None = None, **labels: str) -> list[Notification]:
        with self._lock:
            return [
                n
                for n in self.notifications
                if (alertname is None or n.alertname == alertname)
                and all(n.labels.get(k) == v for k, v in labels.items())
            ]

    def summary(self) -> str:
        with self._lock:
            return (
                "\n".join(
                    f"  {time.strftime('%H:%M:%S', time.localtime(n.received))} {n.path} {n.status} "
                    f"{n.alertname} {n.labels.get('scope', '')} {n.labels.get('severity', '')}"
                    for n in self.notifications
                )
                or "  (nothing received)"
            )

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


# ---- Grafana dashboards ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref_id: str
    expr: str

    def where(self) -> str:
        return f"{self.dashboard} / {self.panel!r} / {self.ref_id}"


def _panels(node: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel of a dashboard: top level, nested in (collapsed) rows, and old-style `rows[].panels`."""
    out: list[dict[str, Any]] = []
    stack = list(node.get("panels", [])) + [p for row in node.get("rows", []) for p in row.get("panels", [])]
    while stack:
        panel = stack.pop(0)
        out.append(panel)
        stack.extend(panel.get("panels", []))
    return out


def dashboard_queries(paths: list[Path]) -> list[PanelQuery]:
    """Every Prometheus query (`targets[].expr`) of every panel of the given dashboards."""
    found = []
    for path in paths:
        doc = json.loads(path.read_text(encoding="utf-8"))
        for panel in _panels(doc):
            for target in panel.get("targets", []) or []:
                expr = target.get("expr")
                if expr and not target.get("hide"):
                    found.append(PanelQuery(path.name, str(panel.get("title", "")), str(target.get("refId", "")), expr))
    return found


def dashboard_variables(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text(encoding="utf-8")).get("templating", {}).get("list", []))


LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?P<match>.+?)\s*,\s*(?P<label>[A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")

GRAFANA_BUILTINS = {
    # Grafana's own value for a 1 s scrape interval would be a few seconds; 1m is what a dashboard at its
    # default range and refresh asks for (and what the rules' short window is compared against).
    "__rate_interval": "1m",
    "__interval": "15s",
    "__interval_ms": "15000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}


def expand(expr: str, values: dict[str, str]) -> str:
    """Grafana's variable interpolation for a Prometheus query: `$name`, `${name}`, `[[name]]`."""

    def value(name: str) -> str:
        if name in values:
            return values[name]
        if name in GRAFANA_BUILTINS:
            return GRAFANA_BUILTINS[name]
        raise KeyError(name)

    out = re.sub(r"\$\{([A-Za-z0-9_]+)(?::[a-z]+)?\}", lambda m: value(m.group(1)), expr)
    out = re.sub(r"\[\[([A-Za-z0-9_]+)\]\]", lambda m: value(m.group(1)), out)
    out = re.sub(r"\$([A-Za-z_][A-Za-z0-9_]*)", lambda m: value(m.group(1)), out)
    return out


def regex_value(values: list[str]) -> str:
    """How Grafana puts a multi-value variable into a Prometheus regex matcher: escaped, alternated."""
    escaped = [re.sub(r"([\\.^$*+?()\[\]{}|])", r"\\\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


# ---- runbooks -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunbookCommand:
    runbook: str
    line: int
    text: str
    """As written, placeholders and all."""

    @property
    def argv_template(self) -> list[str]:
        return shlex.split(self.text)


_FENCE = re.compile(r"^\s*```\s*([A-Za-z0-9_+-]*)\s*$")
SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh", ""}


def runbook_commands(paths: list[Path]) -> list[RunbookCommand]:
    """Every `dpstream …` command line in the fenced shell blocks of the runbooks, in file order."""
    found = []
    for path in paths:
        lang: str | None = None
        pending: list[str] = []
        start = 0
        for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            fence = _FENCE.match(raw)
            if fence:
                lang = None if lang is not None else fence.group(1).lower()
                continue
            if lang is None or lang not in SHELL_LANGS:
                continue
            line = raw.strip()
            if line.startswith("$ "):
                line = line[2:]
            if pending:
                pending.append(line.rstrip("\\").strip())
                if not line.endswith("\\"):
                    found.append(RunbookCommand(path.name, start, " ".join(pending)))
                    pending = []
                continue
            if line.startswith("dpstream ") or line == "dpstream":
                line = line.split(" #", 1)[0].strip()
                if line.endswith("\\"):
                    pending, start = [line.rstrip("\\").strip()], number
                else:
                    found.append(RunbookCommand(path.name, number, line))
    return found


PLACEHOLDER = re.compile(r"<([A-Za-z0-9_.-]+)>")


def fill(text: str, values: dict[str, str]) -> str:
    """Replace every `<name>` placeholder; an unknown one raises KeyError naming it."""
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


# ---- processes ------------------------------------------------------------------------------------


@dataclass
class Processes:
    """`dpstream` subprocesses of one test module, with their logs in `dir`."""

    dir: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "dpstream.workers.cli", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        self.procs[name] = proc
        return proc

    def log(self, name: str, tail: int = 4000) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def stop(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


@dataclass(frozen=True)
class CliResult:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    started: float
    ended: float

    def show(self) -> str:
        return f"$ {shlex.join(self.argv)}\n-> exit {self.returncode}\n{self.stdout[-1500:]}{self.stderr[-1500:]}"


def run_cli(
    argv: list[str], env: dict[str, str] | None = None, timeout: float = 120.0, cwd: Path | None = None
) -> CliResult:
    """Run `dpstream ARGV…` (argv[0] is `dpstream`) as the console script would, in a subprocess (in `cwd`:
    a command that writes a file named relative to it, such as `--html report.html`, writes it there)."""
    assert argv[0] == "dpstream", argv
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "dpstream.workers.cli", *argv[1:]],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
        cwd=cwd,
    )
    return CliResult(argv, done.returncode, done.stdout, done.stderr, started, time.time())


def budget_status(scope: str, env: dict[str, str]) -> dict[str, Any]:
    """`dpstream budget status --scope S --json`'s object for the scope (asserts exit 0)."""
    res = run_cli(["dpstream", "budget", "status", "--scope", scope, "--json"], env)
    assert res.returncode == 0, res.show()
    return dict(json.loads(res.stdout)["scopes"][0])


def poll(condition: Any, timeout_s: float, every_s: float = 0.5) -> Any:
    """Call `condition` until it returns something truthy (returned) or the deadline passes (last value)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every_s)


def choose_period(now: float, candidates: tuple[str, ...], min_left_s: int) -> tuple[str, int]:
    """The first period (UTC-aligned, as the ledger's) whose current block has at least `min_left_s` left,
    so the module never crosses a period rollover; (spelling, seconds)."""
    for spelling in candidates:
        seconds = duration_ms(spelling) // 1000
        left = seconds - int(now) % seconds
        if left >= min_left_s:
            return spelling, seconds
    raise AssertionError(f"no candidate period has {min_left_s} s left at {now}")
