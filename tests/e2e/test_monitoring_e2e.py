"""The shipped monitoring end to end (issue 10, items 3-5): a real `dpstream worker --web-port` and a real
`dpstream exporter`, scraped by a real Prometheus that evaluates the shipped alert rules and notifies a real
Alertmanager running the shipped routing, whose webhooks land in a receiver inside this test.

One module-scoped run (Kafka and Redis of the session) is shared by the three tests:

1. Alertmanager: a budget scope is driven into warning and then to exhaustion; the ticket URL receives
   DPBudgetWarning, then the pager URL receives DPBudgetExhausted, and Alertmanager inhibits the warning.
2. Grafana: every panel query of deploy/grafana/dashboards/*.json, with its variables expanded to the run's
   label values (and to "All"), returns at least one series from this Prometheus.
3. Runbooks: every `dpstream …` command quoted in deploy/runbooks/*.md runs against this ledger with its
   placeholders filled and exits 0 (the reserve grant exits 2, as its runbook says it does when nothing is
   left: this scope's cap is spent); the breaker cycle of DPBudgetExhausted.md opens and closes the breaker.

How the scope gets exhausted. The ledger's allocation is adaptive: each release is allowed
pool-left / releases-left-in-the-period, so one deployment on plan spends its pool evenly and reaches
`warn_at` only `warn_at / (1 - reserve)` of the way from its first release to the period's end, never early,
however small epsilon is. Exhaustion needs a spender the plan does not know about. The test uses one the
runbooks name as a cause: `dpstream replay` pointed at the live ledger (same topology, so the same release
ids). Its public schedule is set to the period's last windows, so the adaptive allowance believes only those
windows are left and gives them the whole remaining pool:
- replaying the last 10 windows but one spends 9/10 of what is left: the ratio passes warn_at (0.8);
- replaying the last window spends the rest: the ratio is 1 (the topology keeps no reserve: `reserve: 0`,
  which `dpstream validate` flags as "the plan alone spends past warn_at", a cause the runbook lists);
- the live worker's next real release then cannot fit, and the ledger opens the breaker by itself.
The period is the first of 1h, 2h, ... whose current UTC block has 15 minutes left, so the module never
sees a rollover.

Prometheus and Alertmanager run with the shipped files, sped up by one documented transformation
(tests/e2e/_monitoring.py, SPEEDUP): `for:` of rules.yml and group_wait / group_interval of the rendered
Alertmanager config are divided by 20; nothing else changes, which the helpers check.
"""

from __future__ import annotations

import contextlib
import json
import random
import shlex
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dpstream.topology.loader import load_topology
from dpstream.topology.model import Topology
from dpstream.workers.localstack import AlertmanagerHandle, PrometheusHandle, free_port
from tests.e2e import _monitoring as mon

pytestmark = pytest.mark.e2e

WINDOW = 5
"""Seconds per window: the live worker releases (and, once exhausted, is refused) every 5 s."""
WARN_AT = 0.8
REPLAY_LAST = 10
"""Phase 1 replays the period's last REPLAY_LAST windows but one (ratio ~0.9), phase 2 the last one (ratio 1)."""
PERIODS = ("1h", "2h", "3h", "4h", "6h", "8h", "12h", "1d", "5h", "7h")
MIN_LEFT_S = 15 * 60
SOURCE = "clicks"
METRICS = ("views", "basket")
REASON = "e2e runbook check"
ACTOR = "e2e-runbook"

TOPOLOGY = """\
# tests/e2e/test_monitoring_e2e.py: a small scope that keeps no reserve (see the module docstring)
version: 1
start: {start}
sources:
  {source}:
    topic: {prefix}.clicks
    privacy_unit: user_id
    timestamp: ts
    allowed_lateness: 1s
    keyed_by_unit: true
budgets:
  {scope}:
    epsilon: 0.5
    delta: 1.0e-6
    accounting: zcdp
    period: {period}
    reserve: 0
    warn_at: {warn_at}
metrics:
  views:
    source: {source}
    budget: {scope}
    weight: 1
    window: {{tumbling: {window}s}}
    aggregate: count
    group_by: page
    keys: [home, cart]
    contribution: {{max_keys: 2, max_per_key: 3}}
    mechanism: gaussian
  basket:
    source: {source}
    budget: {scope}
    weight: 1
    window: {{tumbling: {window}s}}
    aggregate: sum
    value: basket_eur
    bounds: [0, 100]
    contribution: {{max_per_key: 2}}
    mechanism: gaussian
sinks:
  releases: {prefix}.releases
  dead_letter: {prefix}.dlq
"""


class Feeder:
    """Clicks for the live worker, a few per second (and now and then a record that is not JSON, so dead
    letters exist too), until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from kafka import KafkaProducer

        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
        self.topic = topic
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rng = random.Random(7)
        tick = 0
        while not self._stop.is_set():
            now = time.time()
            for _ in range(8):
                user = f"u{rng.randrange(200)}"
                doc = {
                    "user_id": user,
                    "ts": now,
                    "page": rng.choice(["home", "cart"]),
                    "basket_eur": round(rng.uniform(0, 120), 2),
                }
                self.producer.send(self.topic, key=user.encode(), value=json.dumps(doc).encode())
                self.sent += 1
            if tick % 4 == 0:
                self.producer.send(self.topic, key=b"x", value=b"not json")
            tick += 1
            self._stop.wait(0.5)
        self.producer.flush()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.producer.close()


@dataclass
class Live:
    """The running stack of this module."""

    dir: Path
    topology_path: Path
    topology: Topology
    scope: str
    period_s: int
    period_end: int
    redis_url: str
    prometheus: mon.Prometheus
    alertmanager: mon.Alertmanager
    webhook: mon.WebhookReceiver
    procs: mon.Processes
    am_config: Path
    plan: dict[str, Any]
    cli_env: dict[str, str] = field(default_factory=dict)

    def logs(self) -> str:
        return "\n".join(f"--- {name}.log (tail)\n{self.procs.log(name, 2500)}" for name in self.procs.procs)

    def replay(self, start: int, end: int, name: str) -> mon.CliResult:
        """`dpstream replay` of the topology over [start, end), pointed at the live ledger."""
        events = self.dir / "replay-events.jsonl"
        events.write_text("")
        return mon.run_cli(
            [
                "dpstream",
                "replay",
                str(self.topology_path),
                str(events),
                "--ledger",
                self.redis_url,
                "--from",
                str(start),
                "--to",
                str(end),
                "--out",
                str(self.dir / f"{name}.jsonl"),
            ],
            self.cli_env,
        )

    def status(self) -> dict[str, Any]:
        return mon.budget_status(self.scope, self.cli_env)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, kafka_broker, redis_server) -> Iterator[Live]:  # noqa: ANN001
    from dpstream.topology.errors import ConfigError
    from dpstream.workers.localstack import sysdeps
    from dpstream.workers.runtime.topics import ensure_topics

    try:  # as root, the local stack apt-get installs what is missing (first run only)
        sysdeps.ensure([sysdeps.PROMETHEUS, sysdeps.PROMTOOL, sysdeps.ALERTMANAGER])
    except ConfigError as exc:
        pytest.skip(str(exc))
    redis_server.flush()  # the module's own fresh Redis (fresh_redis is per test; this run spans three)
    root = tmp_path_factory.mktemp("monitoring")
    prefix = f"e2e-mon-{uuid.uuid4().hex[:8]}"
    scope = f"mon_{uuid.uuid4().hex[:6]}"
    now = time.time()
    period, period_s = mon.choose_period(now, PERIODS, MIN_LEFT_S)
    path = root / "topology.yaml"
    path.write_text(
        TOPOLOGY.format(
            start=int(now) // WINDOW * WINDOW,
            source=SOURCE,
            prefix=prefix,
            scope=scope,
            period=period,
            warn_at=WARN_AT,
            window=WINDOW,
        )
    )
    topology = load_topology(path)
    ensure_topics(kafka_broker.bootstrap, topology)
    cli_env = {"DPSTREAM_REDIS": redis_server.url, "DPSTREAM_KAFKA": kafka_broker.bootstrap, "USER": ACTOR}

    plan_run = mon.run_cli(["dpstream", "plan", str(path), "--json"], cli_env)
    assert plan_run.returncode == 0, plan_run.show()
    plan = json.loads(plan_run.stdout)

    with contextlib.ExitStack() as stack:
        webhook = mon.WebhookReceiver()
        stack.callback(webhook.close)
        am_config = mon.render_alertmanager(root / "alertmanager.yml", webhook.url("/pager"), webhook.url("/ticket"))
        rules = mon.fast_rules(root / "rules.fast.yml")
        used: set[int] = set()

        def port() -> int:
            p = free_port(avoid=frozenset(used))
            used.add(p)
            return p

        worker_port, exporter_port, prom_port, am_port = port(), port(), port(), port()
        prom_config = root / "prometheus.yml"
        prom_config.write_text(mon.prometheus_config(rules, am_port, worker_port, exporter_port))

        am = AlertmanagerHandle(am_port, root / "alertmanager", am_config)
        am.start()
        stack.callback(am.stop)
        prom = PrometheusHandle(prom_port, root / "prometheus", prom_config, alertmanager_port=am_port)
        prom.start()
        stack.callback(prom.stop)

        procs = mon.Processes(root)
        stack.callback(procs.stop_all)
        procs.start(
            "worker",
            [
                "worker",
                str(path),
                "--bootstrap",
                kafka_broker.bootstrap,
                "--redis",
                redis_server.url,
                "--worker-id",
                "mon-w1",
                "--web-port",
                str(worker_port),
                "--curator-metrics",  # the operator's own Prometheus: DPReleaseLag and 3 dashboards need them
            ],
        )
        procs.start(
            "exporter", ["exporter", "--topology", str(path), "--redis", redis_server.url, "--port", str(exporter_port)]
        )
        feeder = Feeder(kafka_broker.bootstrap, topology.sources[SOURCE].topic)
        stack.callback(feeder.stop)

        run = Live(
            root,
            path,
            topology,
            scope,
            period_s,
            (int(now) // period_s + 1) * period_s,
            redis_server.url,
            mon.Prometheus(prom.url),
            mon.Alertmanager(am.url),
            webhook,
            procs,
            am_config,
            plan,
            cli_env,
        )

        def healthy() -> bool:
            for name in ("worker", "exporter"):
                assert procs.procs[name].poll() is None, f"{name} exited:\n{run.logs()}"
            return (
                mon.http_get(f"http://127.0.0.1:{worker_port}/health", 2)[0] == 200
                and mon.http_get(f"http://127.0.0.1:{exporter_port}/metrics", 5)[0] == 200
            )

        assert mon.poll(healthy, 120, 1.0), f"worker/exporter not serving:\n{run.logs()}"

        def scraped_and_releasing() -> bool:
            up = run.prometheus.query('up{job=~"dpstream-worker|dpstream-exporter"} == 1')
            published = run.prometheus.query('sum(dpstream_releases_total{outcome="published"}) > 0')
            return len(up) == 2 and bool(published)

        assert mon.poll(scraped_and_releasing, 120, 1.0), (
            f"Prometheus does not see both targets up and a published release:\n{run.logs()}"
        )
        yield run


@dataclass
class Exhaustion:
    """What the drive to exhaustion saw: ledger statuses and the first notification of each alert."""

    warned: dict[str, Any]
    warning: list[mon.Notification]
    exhausted: dict[str, Any]
    breaker: dict[str, Any] | None
    paged: list[mon.Notification]


@pytest.fixture(scope="module")
def exhausted(live: Live) -> Exhaustion:
    """Phase 1 (warning), wait for the ticket, phase 2 (exhaustion), wait for the breaker and the page.

    Ledger preconditions are asserted here; what Alertmanager sent is asserted by the tests."""
    scope_plan = next(s for s in live.plan["scopes"] if s["name"] == live.scope)
    assert scope_plan["reserve"] == 0 and scope_plan["pool"] == scope_plan["cap"], scope_plan
    assert scope_plan["releases_per_period"] == len(METRICS) * live.period_s // WINDOW, scope_plan
    last = live.period_end - WINDOW
    first = live.period_end - REPLAY_LAST * WINDOW
    assert first > time.time() + 60, "the period ends too soon for this test"

    replay = live.replay(first, last, "replay-phase1")
    assert replay.returncode == 0 and f"published={(REPLAY_LAST - 1) * len(METRICS)}," in replay.stderr, replay.show()
    warned = live.status()
    assert warned["state"] == "warning" and WARN_AT <= warned["ratio"] < 0.999, warned
    warning = mon.poll(lambda: live.webhook.received("DPBudgetWarning", scope=live.scope), 120)

    replay = live.replay(last, live.period_end, "replay-phase2")
    assert replay.returncode == 0 and f"published={len(METRICS)}," in replay.stderr, replay.show()
    spent = live.status()
    assert spent["ratio"] == 1.0 and spent["units"]["spent"] == spent["units"]["cap"], spent

    def breaker_open() -> dict[str, Any] | None:
        status = live.status()
        return status if status["breaker"] is not None else None

    breaker = mon.poll(breaker_open, 60, 1.0)
    paged = mon.poll(lambda: live.webhook.received("DPBudgetExhausted", scope=live.scope), 120)
    return Exhaustion(warned, warning or [], spent, breaker, paged or [])


def test_alertmanager_tickets_the_warning_pages_the_exhaustion_and_inhibits_the_warning(
    live: Live, exhausted: Exhaustion
) -> None:
    """Real releases charge a real ledger; Prometheus (shipped rules) and Alertmanager (shipped routing, rendered
    by render.sh) notify the webhook: DPBudgetWarning at the ticket URL, then DPBudgetExhausted at the pager URL,
    both for the scope; the live worker's next release opened the breaker; the warning, still firing in
    Prometheus, is then inhibited by the exhaustion and not sent again."""
    hook, scope = live.webhook, live.scope
    assert exhausted.warning, f"no DPBudgetWarning for {scope} reached the webhook:\n{hook.summary()}"
    assert exhausted.breaker is not None, f"the ledger did not open the breaker:\n{live.logs()}"
    breaker = exhausted.breaker["breaker"]
    assert breaker["manual"] is False and breaker["actor"] == "ledger", breaker
    assert breaker["reason"].startswith("budget exhausted"), breaker
    assert exhausted.breaker["state"] == "open" and exhausted.breaker["releases"]["refused"] >= 1, exhausted.breaker
    assert exhausted.paged, f"no DPBudgetExhausted for {scope} reached the webhook:\n{hook.summary()}"

    warnings = hook.received("DPBudgetWarning", scope=scope)
    pages = hook.received("DPBudgetExhausted", scope=scope)
    for note, path, severity in [
        *((n, "/ticket", "warning") for n in warnings),
        *((n, "/pager", "critical") for n in pages),
    ]:
        assert note.path == path and note.labels.get("severity") == severity, (note, hook.summary())
        assert note.annotations.get("runbook_url", "").endswith(f"/deploy/runbooks/{note.alertname}.md"), note
        assert note.annotations.get("summary") and note.annotations.get("description"), note
    first_warning = min((n.received for n in warnings if n.status == "firing"), default=float("inf"))
    first_page = min((n.received for n in pages if n.status == "firing"), default=float("inf"))
    assert first_warning < first_page, hook.summary()

    # The warning is still firing in Prometheus (spend never goes down in a period) ...
    def warning_firing() -> bool:
        return any(
            a["labels"].get("alertname") == "DPBudgetWarning"
            and a["labels"].get("scope") == scope
            and a["state"] == "firing"
            for a in live.prometheus.alerts()
        )

    assert mon.poll(warning_firing, 30), live.prometheus.alerts()

    # ... and Alertmanager suppresses it, inhibited by the scope's DPBudgetExhausted (inhibit_rules, equal: scope).
    def inhibited() -> dict[str, Any] | None:
        source = [
            a
            for a in live.alertmanager.alerts(alertname="DPBudgetExhausted", scope=scope)
            if a["status"]["state"] == "active"
        ]
        target = live.alertmanager.alerts(alertname="DPBudgetWarning", scope=scope)
        if (
            len(source) == 1
            and len(target) == 1
            and target[0]["status"]["state"] == "suppressed"
            and source[0]["fingerprint"] in target[0]["status"]["inhibitedBy"]
        ):
            return target[0]
        return None

    suppressed = mon.poll(inhibited, 60)
    assert suppressed, (
        live.alertmanager.alerts(alertname="DPBudgetWarning", scope=scope),
        live.alertmanager.alerts(alertname="DPBudgetExhausted", scope=scope),
    )

    # What Alertmanager sends for an inhibited alert: nothing. Not a repeat as firing, not a resolved: the
    # notification pipeline drops muted alerts before its dedup stage. Watch one whole group_interval (the
    # longest time before the warning's group is flushed again) after the page.
    group_interval = mon.am_durations(live.am_config)["group_interval"] / 1000
    deadline = max(time.time(), first_page + group_interval + 3)
    late = mon.poll(
        lambda: [n for n in hook.received("DPBudgetWarning", scope=scope) if n.received > first_page],
        deadline - time.time(),
    )
    assert not late, f"DPBudgetWarning sent after the exhaustion page:\n{hook.summary()}"


def test_every_dashboard_query_returns_series(live: Live, exhausted: Exhaustion) -> None:
    """Every panel query of the shipped dashboards (targets[].expr, nested rows included), its variables expanded
    to each of this run's label values and to "All", returns at least one series from the run's Prometheus."""
    # the feed dashboard's queries are checked against released values by tests/e2e/test_feed_e2e.py
    paths = sorted(p for p in mon.DASHBOARDS.glob("*.json") if p.name != "dpstream-feed.json")
    assert len(paths) == 4, paths
    queries = mon.dashboard_queries(paths)
    assert len(queries) >= 40, len(queries)
    expected = {"scope": [live.scope], "metric": list(METRICS), "source": [SOURCE]}

    expansions: dict[str, list[dict[str, str]]] = {}
    for path in paths:
        combos: list[dict[str, str]] = [{}]
        for var in mon.dashboard_variables(path):
            if var.get("type") != "query":
                continue
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            parsed = mon.LABEL_VALUES.match(query)
            assert parsed, f"{path.name}: variable {var['name']}: not label_values(...): {query}"
            values = mon.poll(lambda p=parsed: live.prometheus.label_values(p["label"], p["match"]), 60)
            assert set(expected[var["name"]]) <= set(values), (path.name, var["name"], values)
            choices = [mon.regex_value([v]) for v in expected[var["name"]]]
            if var.get("includeAll"):
                choices.append(var.get("allValue") or mon.regex_value(values))
            combos = [{**c, var["name"]: choice} for c in combos for choice in choices]
        expansions[path.name] = combos

    todo = {(q.where(), mon.expand(q.expr, values)) for q in queries for values in expansions[q.dashboard]}
    for _where, expr in todo:
        assert "$" not in expr and "[[" not in expr, expr
    failures: dict[tuple[str, str], str] = {}

    def evaluate() -> bool:
        failures.clear()
        for where, expr in sorted(todo):
            try:
                result = live.prometheus.query(expr)
            except AssertionError as exc:
                failures[(where, expr)] = str(exc)
                continue
            if not result:
                failures[(where, expr)] = "no series"
        return not failures

    mon.poll(evaluate, 90, 2.0)
    assert not failures, f"{len(failures)} of {len(todo)} panel queries failed:\n" + "\n".join(
        f"- {where}: {why}\n    {expr}" for (where, expr), why in sorted(failures.items())
    )


EXPECTED_EXIT: dict[str, int] = {}
"""Non-zero exit codes the runbooks document for a command as run here (filled text -> code). None: the only
documented failures are `budget reconcile`'s exit 1 on a ledger mismatch (this ledger is sound) and
DPLedgerUnavailable's `budget status` failing while Redis is unreachable (here it is reachable)."""

PLACEHOLDERS = {
    "scope": None,  # the run's scope
    "topology.yaml": None,  # the run's topology file
    "reason": REASON,
    "amount": "0.0001",  # ρ: a small reserve grant (DPBudgetWarning.md)
    "metric": "views",  # the alert's metric label
}


def _writes(argv: list[str]) -> bool:
    return argv[1] == "breaker" or argv[1:3] == ["budget", "grant"]


def test_runbook_commands_run_against_the_live_ledger(live: Live, exhausted: Exhaustion) -> None:
    """Every `dpstream …` command in the runbooks' fenced shell blocks, placeholders filled, runs against this run's
    ledger ($DPSTREAM_REDIS, as the runbooks' conventions say) and exits 0 (or the documented code). The breaker
    cycle of DPBudgetExhausted.md really opens (manual, with actor and reason) and closes the breaker, checked with
    `dpstream budget status --json` after each step and in the audit trail."""
    paths = sorted(mon.RUNBOOKS.glob("*.md"))
    commands = mon.runbook_commands(paths)
    alerts = {p.stem for p in paths if p.stem.startswith("DP")}
    assert alerts <= {c.runbook.removesuffix(".md") for c in commands}, "a runbook quotes no dpstream command"
    values = {**PLACEHOLDERS, "scope": live.scope, "topology.yaml": str(live.topology_path)}
    env = live.cli_env
    failures: list[str] = []
    filled: list[tuple[mon.RunbookCommand, str, list[str]]] = []
    for command in commands:
        try:
            text = mon.fill(command.text, values)
        except KeyError as exc:
            failures.append(f"{command.runbook}:{command.line}: unknown placeholder <{exc.args[0]}>: {command.text}")
            continue
        filled.append((command, text, shlex.split(text)))

    def check(command: mon.RunbookCommand, text: str, argv: list[str], result: mon.CliResult) -> None:
        want = EXPECTED_EXIT.get(text, 0)
        # this run's scope has spent its cap, so a reserve grant has nothing to widen: DPBudgetWarning.md
        # documents the refusal (exit 2, one line naming what is left), and DPBudgetExhausted.md says a
        # grant cannot help then
        refused_grant = argv[1:3] == ["budget", "grant"]
        if refused_grant:
            want = 2
        if result.returncode != want:
            failures.append(f"{command.runbook}:{command.line}: expected exit {want}\n{result.show()}")
        elif refused_grant and not ("nothing left to grant" in result.stderr and "the cap is spent" in result.stderr):
            failures.append(f"{command.runbook}:{command.line}: the grant's refusal should say why\n{result.show()}")
        elif "--json" in argv:
            json.loads(result.stdout)

    # Read-only commands (budget status/history/audit/reconcile, validate, plan) change nothing: each distinct
    # one runs once, three at a time (on two loaded cores a CLI start costs seconds).
    reads = list(dict.fromkeys(text for _c, text, argv in filled if not _writes(argv)))
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = dict(
            zip(reads, pool.map(lambda text: mon.run_cli(shlex.split(text), env, cwd=live.dir), reads), strict=True)
        )
    for command, text, argv in filled:
        if not _writes(argv):
            check(command, text, argv, results[text])

    # Commands that write (breaker open/close, budget grant): every occurrence, in runbook order.
    cycle: list[tuple[str, mon.CliResult, dict[str, Any]]] = []
    for command, text, argv in filled:
        if not _writes(argv):
            continue
        result = results[text] = mon.run_cli(argv, env, cwd=live.dir)
        check(command, text, argv, result)
        if command.runbook == "DPBudgetExhausted.md" and argv[1] == "breaker":
            cycle.append((argv[2], result, live.status()))

    assert not failures, "\n\n".join(failures)
    assert len(results) >= 15, sorted(results)

    # The breaker cycle of DPBudgetExhausted.md: a manual open over the ledger's automatic one, then a close.
    assert [step for step, _res, _st in cycle] == ["open", "close"], cycle
    (_, opened, after_open), (_, closed, after_close) = cycle
    assert f"{live.scope}: breaker opened" in opened.stdout, opened.show()
    assert after_open["state"] == "open" and after_open["breaker"] is not None, after_open
    assert after_open["breaker"]["manual"] is True, after_open
    assert after_open["breaker"]["actor"] == ACTOR and after_open["breaker"]["reason"] == REASON, after_open
    assert f"{live.scope}: breaker closed" in closed.stdout, closed.show()
    # Closed. The live worker keeps releasing every 5 s and the cap is spent, so its next release may already
    # have reopened it, automatically, as the runbook's "Never" warns; a manual open must be gone either way.
    reopened = after_close["breaker"]
    assert reopened is None or (
        reopened["manual"] is False
        and reopened["actor"] == "ledger"
        and reopened["at"] >= time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(closed.started)))
    ), after_close
    audit = mon.run_cli(["dpstream", "budget", "audit", "--scope", live.scope, "--since", "10m", "--json"], env)
    assert audit.returncode == 0, audit.show()
    ours = [(e["kind"], e.get("reason")) for e in json.loads(audit.stdout)["entries"] if e.get("actor") == ACTOR]
    assert ("breaker_open", REASON) in ours and ("breaker_close", REASON) in ours, ours
