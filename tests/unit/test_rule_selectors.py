"""The alert rules take their scrape-job selectors from one place, deploy/prometheus/selectors.yml."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.debian_tools import debian_tool

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_rules", PROMETHEUS_DIR / "gen_rules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _job_matchers(text: str) -> set[str]:
    """Every `job=` matcher in the rules' expressions."""
    doc = yaml.safe_load(text)
    exprs = [rule["expr"] for group in doc["groups"] for rule in group["rules"]]
    return {m for expr in exprs for m in re.findall(r'job\s*=~?\s*"[^"]*"', expr)}


def test_rules_yml_is_generated_from_the_source_and_the_selectors() -> None:
    """The committed rules.yml is what gen_rules.py writes (it fails while stale)."""
    result = subprocess.run(
        [sys.executable, str(PROMETHEUS_DIR / "gen_rules.py"), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "job=" not in (PROMETHEUS_DIR / "rules.src.yml").read_text(encoding="utf-8").split("groups:", 1)[1]


def test_the_default_selectors_are_the_scrape_jobs_of_prometheus_yml() -> None:
    """selectors.yml's defaults name the jobs prometheus.yml scrapes, and every job the rules select is one of them."""
    gen = _generator()
    chosen = gen.selectors()
    jobs = {c["job_name"] for c in yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())["scrape_configs"]}
    assert chosen == {"worker_selector": 'job="dpstream-worker"', "exporter_selector": 'job="dpstream-exporter"'}
    assert {m.split('"')[1] for m in _job_matchers(gen.render())} == {"dpstream-worker", "dpstream-exporter"} <= jobs


def test_other_job_names_change_every_selector_and_still_pass_promtool(tmp_path: Path) -> None:
    """Rendered with other selectors, no rule selects the default jobs and promtool accepts the rules."""
    gen = _generator()
    other = {"worker_selector": 'job="dp-w", cluster="eu"', "exporter_selector": 'job=~"dp-exp.*"'}
    text = gen.render(other)
    assert "dpstream-worker" not in "".join(_job_matchers(text)) and "dpstream-exporter" not in "".join(
        _job_matchers(text)
    )
    assert _job_matchers(text) == {'job="dp-w"', 'job=~"dp-exp.*"'}
    path = tmp_path / "rules.yml"
    path.write_text(text, encoding="utf-8")
    promtool = debian_tool("promtool", "prometheus", "the stack installs it with `up prometheus`")
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
