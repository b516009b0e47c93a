"""The Prometheus alert rules, their promtool tests, the sample Prometheus config and the runbooks (DESIGN §7).

Only files and external tools are used here (promtool, and the `dpstream` CLI as a subprocess to check that
every runbook command parses): no project module is imported.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.debian_tools import debian_tool

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS_DIR / "rules.yml"
RULES_TEST = PROMETHEUS_DIR / "rules.test.yml"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
RUNBOOKS = ROOT / "deploy" / "runbooks"
RUNBOOK_BASE = "https://github.com/dpstream/dpstream/blob/main/"

# DESIGN §7: the alert names are fixed.
DESIGN_ALERTS = (
    "DPBudgetWarning",
    "DPBudgetExhausted",
    "DPBreakerOpen",
    "DPBudgetBurnRateHigh",
    "DPBudgetBurnRateElevated",
    "DPBudgetProjectedExhaustion",
    "DPLedgerUnavailable",
    "DPReleasesRefused",
    "DPReleaseLag",
    "DPReleasesParked",  # issue 11 item 5 (poison windows); DESIGN §7 lists the others
    "DPClockSkew",  # window closes held for worker-broker clock skew
    "DPMetricEventsSkipped",  # a metric leaves out many accepted events (renamed field, mis-cased key)
    "DPReleaseConflict",  # a release_id republished with other bytes on the releases topic
    "DPWorkerDown",
    "DPExporterDown",
)
# Labels an annotation may name: what is alerted on, never a value (DESIGN §1 trust boundary).
TEMPLATE_LABELS = {"scope", "metric", "source", "currency", "outcome", "job", "instance"}
RUNBOOK_SECTIONS = ("## What it means", "## Confirm", "## What to do", "## Never", "## Verify recovery")


@pytest.fixture(scope="module")
def promtool() -> str:
    """promtool, from Debian's `prometheus` package."""
    return debian_tool("promtool", "prometheus", "the stack installs it with `up prometheus`")


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _alerts() -> list[dict[str, Any]]:
    return [rule for rule in _rules() if "alert" in rule]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)


# --- promtool -------------------------------------------------------------------------------------------


def test_promtool_check_rules(promtool: str) -> None:
    """`promtool check rules` accepts rules.yml (syntax, PromQL, templates, no duplicate rules)."""
    result = _run([promtool, "check", "rules", str(RULES)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules(promtool: str) -> None:
    """Every promtool unit test in rules.test.yml passes."""
    result = _run([promtool, "test", "rules", str(RULES_TEST)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_check_prometheus_config(promtool: str) -> None:
    """The sample prometheus.yml is valid and its rule_files (relative to deploy/prometheus/) are found."""
    result = _run([promtool, "check", "config", str(PROMETHEUS_CONFIG)])
    assert result.returncode == 0, result.stdout + result.stderr


# --- structure of the rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DESIGN_ALERTS)
def test_design_alert_defined_with_severity_and_annotations(name: str) -> None:
    """Each DESIGN §7 alert exists; its rules have severity critical|warning, summary, description, runbook_url."""
    rules = [rule for rule in _alerts() if rule["alert"] == name]
    assert rules, f"alert {name} is missing from {RULES.relative_to(ROOT)}"
    for rule in rules:
        assert rule.get("labels", {}).get("severity") in {"critical", "warning"}, rule
        for key in ("summary", "description", "runbook_url"):
            assert str(rule.get("annotations", {}).get(key, "")).strip(), f"{name}: no {key}"


def test_no_alert_outside_the_design() -> None:
    """Alert names are a contract: rules.yml defines no alert that DESIGN §7 does not name."""
    assert {rule["alert"] for rule in _alerts()} <= set(DESIGN_ALERTS)


def test_one_severity_per_alert_name() -> None:
    """An alert name always routes the same way: all its rules carry one severity."""
    severities: dict[str, set[str]] = {}
    for rule in _alerts():
        severities.setdefault(rule["alert"], set()).add(rule["labels"]["severity"])
    assert {name: sev for name, sev in severities.items() if len(sev) > 1} == {}


def test_labels_and_annotations_carry_no_values() -> None:
    """No alert label or annotation renders a value: no $value, no query; only names of scopes, metrics, sources."""
    for rule in _alerts():
        assert set(rule["labels"]) == {"severity"}, rule["alert"]
        for key, text in rule["annotations"].items():
            assert "$value" not in text and ".Value" not in text and "query" not in text, (rule["alert"], key)
            for action in re.findall(r"\{\{(.*?)\}\}", text):
                for ref in re.findall(r"\$(\w+)(?:\.(\w+))?", action):
                    assert ref[0] == "labels" and ref[1] in TEMPLATE_LABELS, (rule["alert"], key, action)


def test_budget_rules_hard_code_no_warn_threshold() -> None:
    """DPBudgetWarning compares with the scope's own dpstream_budget_warn_ratio, not a constant."""
    rules = {rule.get("record") or rule.get("alert"): rule for rule in _rules()}
    assert "scope:dpstream_budget_warn_ratio:max" in rules["DPBudgetWarning"]["expr"]
    assert "dpstream_budget_warn_ratio" in rules["scope:dpstream_budget_warn_ratio:max"]["expr"]


def test_runbook_urls_point_at_existing_runbooks() -> None:
    """Every runbook_url is <base>deploy/runbooks/<AlertName>.md and that file exists."""
    for rule in _alerts():
        url = rule["annotations"]["runbook_url"]
        assert url == f"{RUNBOOK_BASE}deploy/runbooks/{rule['alert']}.md", url
        assert (ROOT / url.removeprefix(RUNBOOK_BASE)).is_file(), url


def test_every_alert_fires_and_stays_silent_in_promtool_tests() -> None:
    """rules.test.yml has, for every alert, a case where it fires and one where it stays silent."""
    doc = yaml.safe_load(RULES_TEST.read_text(encoding="utf-8"))
    assert doc["rule_files"] == ["rules.yml"]
    firing: set[str] = set()
    silent: set[str] = set()
    for test in doc["tests"]:
        for case in test.get("alert_rule_test", []):
            (firing if case.get("exp_alerts") else silent).add(case["alertname"])
    assert set(DESIGN_ALERTS) - firing == set(), "alerts without a firing case"
    assert set(DESIGN_ALERTS) - silent == set(), "alerts without a silent case"


# --- the sample Prometheus config -----------------------------------------------------------------------


def test_prometheus_config_jobs_rules_and_alertmanager() -> None:
    """prometheus.yml scrapes the dpstream-worker and dpstream-exporter jobs, loads rules.yml, alerts Alertmanager."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {"dpstream-worker", "dpstream-exporter"} <= jobs
    assert config["rule_files"] == ["rules.yml"]
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    # The rules alert on exactly these job names.
    text = RULES.read_text(encoding="utf-8")
    assert 'up{job="dpstream-worker"}' in text and 'up{job="dpstream-exporter"}' in text


# --- runbooks -------------------------------------------------------------------------------------------


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block of a Markdown text, list-item indentation removed."""
    blocks = []
    for m in re.finditer(r"^([ \t]*)```(\w*)\n(.*?)^[ \t]*```", text, flags=re.S | re.M):
        indent = len(m.group(1))
        blocks.append(
            (
                m.group(2),
                "".join(ln[indent:] if ln[:indent].isspace() else ln for ln in m.group(3).splitlines(keepends=True)),
            )
        )
    return blocks


def _runbook_commands() -> list[str]:
    commands = []
    for path in sorted(RUNBOOKS.glob("*.md")):
        for lang, body in _fenced_blocks(path.read_text(encoding="utf-8")):
            if lang == "bash":
                commands += [ln.strip() for ln in body.splitlines() if ln.strip() and not ln.startswith("#")]
    return commands


@pytest.mark.parametrize("name", DESIGN_ALERTS)
def test_runbook_sections(name: str) -> None:
    """A runbook says what its alert means (privacy, consumers), how to confirm, act, what never to do, verify."""
    text = (RUNBOOKS / f"{name}.md").read_text(encoding="utf-8")
    assert text.startswith(f"# {name}\n")
    for section in RUNBOOK_SECTIONS:
        assert section in text, f"{name}.md: no '{section}'"
    assert "**For privacy:**" in text and "**For the feed's consumers:**" in text
    assert any(lang == "bash" for lang, _ in _fenced_blocks(text)), f"{name}.md: no dpstream command to confirm with"
    assert f"({name}.md)" in (RUNBOOKS / "README.md").read_text(encoding="utf-8"), "not in the runbook index"


def test_exhaustion_runbook_walks_the_breaker_cycle() -> None:
    """DPBudgetExhausted.md confirms with status/audit/reconcile/history and opens and closes the breaker."""
    commands = set()
    for lang, body in _fenced_blocks((RUNBOOKS / "DPBudgetExhausted.md").read_text(encoding="utf-8")):
        if lang == "bash":
            commands |= {" ".join(ln.split()[:3]) for ln in body.splitlines() if ln.startswith("dpstream")}
    assert {
        "dpstream budget status",
        "dpstream budget audit",
        "dpstream budget reconcile",
        "dpstream budget history",
        "dpstream breaker open",
        "dpstream breaker close",
    } <= commands


def test_runbook_commands_live_in_bash_blocks() -> None:
    """Every line of a bash block is a `dpstream` command; no dpstream command hides in another kind of block."""
    for path in sorted(RUNBOOKS.glob("*.md")):
        for lang, body in _fenced_blocks(path.read_text(encoding="utf-8")):
            lines = [ln.strip() for ln in body.splitlines() if ln.strip() and not ln.startswith("#")]
            if lang == "bash":
                assert all(ln.startswith("dpstream ") for ln in lines), (path.name, lines)
            else:
                assert not any(ln.startswith("dpstream ") for ln in lines), (path.name, lang, lines)


_PLACEHOLDERS = {"<scope>": "runbook-check", "<reason>": "runbook check", "<amount>": "0.001", "<metric>": "m"}


def test_runbook_commands_parse(tmp_path: Path) -> None:
    """Every runbook command is accepted by the real CLI's argument parser (run against an unreachable Redis)."""
    dpstream = shutil.which("dpstream")
    if dpstream is None or _run([dpstream, "--help"]).returncode != 0:
        pytest.skip("the dpstream CLI is not installed (pip install -e '.[dev]')")
    placeholders = {**_PLACEHOLDERS, "<topology.yaml>": str(tmp_path / "topology.yaml")}
    shapes: dict[tuple[str, ...], list[str]] = {}
    for command in _runbook_commands():
        for placeholder, value in placeholders.items():
            command = command.replace(placeholder, value)
        assert not re.search(r"<[^>]*>", command), f"unknown placeholder in {command!r}"
        argv = shlex.split(command)
        argv[0] = dpstream
        if argv[1] in {"budget", "breaker"}:
            argv += ["--redis", "redis://127.0.0.1:1/0"]  # nothing listens: parse, then fail to connect
        # One run per shape (sub-commands and option names): each start of the CLI costs seconds.
        shapes.setdefault(tuple(tok for tok in argv[1:] if tok.startswith("-") or tok.isalpha()), argv)
    argvs = list(shapes.values())
    procs = [
        (argv, subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for argv in argvs
    ]
    for argv, proc in procs:
        _, err = proc.communicate(timeout=120)
        assert "usage:" not in err and "error: argument" not in err, f"{' '.join(argv[1:])}: {err.strip()}"
