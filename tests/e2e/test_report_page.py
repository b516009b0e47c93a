"""The report page (`dpstream budget report --html`) of a period driven through `dpstream replay` onto a real
Redis ledger, opened in headless Chromium: every plot rendered (a non-empty image with ink), no console
error, nothing fetched from the network. A screenshot stays in the test's temp dir (CI artifact)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from dpstream.topology.loader import load_topology
from dpstream.workers.cli import main
from dpstream.workers.synthetic import EventGenerator, GeneratorConfig, write_jsonl

pytestmark = pytest.mark.e2e
pytest.importorskip("matplotlib")
pytest.importorskip("dp_accounting")

EXAMPLE = Path(__file__).resolve().parents[2] / "topology" / "examples" / "web-analytics.yaml"
DAY = 86_400
DB = 5

_HEAD = (
    "<script>window.__errs=[];window.addEventListener('error',function(e){__errs.push(String(e.message||"
    "(e.target&&e.target.outerHTML)||'error'))},true);var __ce=console.error;console.error=function(){"
    "__errs.push(Array.prototype.join.call(arguments,' '));__ce.apply(console,arguments)};</script>"
)
"""Test-only probe, first in <head>: records script errors, failed resource loads and console.error calls."""

_BODY = """<script>(async function(){var out={errors:window.__errs,plots:{}};
for(const f of document.querySelectorAll('figure[data-plot]')){const svg=f.querySelector('svg');
const r=svg?svg.getBoundingClientRect():{width:0,height:0};let ink=0,px=0;
if(svg&&r.width>0&&r.height>0){const xml=new XMLSerializer().serializeToString(svg);const img=new Image();
img.src='data:image/svg+xml;charset=utf-8,'+encodeURIComponent(xml);await img.decode();
const c=document.createElement('canvas');c.width=Math.ceil(r.width);c.height=Math.ceil(r.height);
const g=c.getContext('2d');g.fillStyle='#fff';g.fillRect(0,0,c.width,c.height);g.drawImage(img,0,0,c.width,c.height);
const d=g.getImageData(0,0,c.width,c.height).data;px=d.length/4;
for(let i=0;i<d.length;i+=4){if(d[i]<245||d[i+1]<245||d[i+2]<245)ink++;}}
out.plots[f.dataset.plot]={width:r.width,height:r.height,ink:ink,pixels:px};}
const pre=document.createElement('pre');pre.id='probe';pre.textContent=JSON.stringify(out);
document.body.appendChild(pre);})().catch(function(e){const pre=document.createElement('pre');pre.id='probe';
pre.textContent=JSON.stringify({fatal:String(e),errors:window.__errs});document.body.appendChild(pre);});</script>"""
"""Test-only probe, last in <body>: draws each plot's SVG onto a canvas and counts the pixels with ink."""


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's headless `chromium`: installed with apt-get when root (as the local stack does for its
    servers), else the test is skipped with the command to run."""
    from dpstream.topology.errors import ConfigError
    from dpstream.workers.localstack.sysdeps import Requirement, ensure

    try:
        ensure([Requirement("chromium", "chromium")])
    except ConfigError as exc:
        pytest.skip(f"headless Chromium unavailable: {exc}")
    path = shutil.which("chromium")
    assert path is not None
    return path


def _chromium(binary: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions"]
    env = {**os.environ, "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=180, check=False, env=env)


@pytest.fixture(scope="module")
def page(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Six hours of yesterday's period of the example, replayed onto Redis (db 5), its report and page."""
    import redis as redis_py

    url = re.sub(r"/\d*$", f"/{DB}", redis_server.url) if re.search(r":\d+/\d*$", redis_server.url) else None
    url = url or f"{redis_server.url}/{DB}"
    client = redis_py.Redis.from_url(url)
    client.flushdb()
    tmp = tmp_path_factory.mktemp("page")
    now = int(time.time())
    day = now - now % DAY - DAY
    gen = EventGenerator(load_topology(EXAMPLE), config=GeneratorConfig(users=500, seed=5, start_ts=day + 0.5))
    write_jsonl(tmp / "events.jsonl", gen.events(4_000, rate=4_000 / (6 * 3600)))
    replay = ["replay", str(EXAMPLE), str(tmp / "events.jsonl"), "--ledger", url, "--from", str(day)]
    assert main([*replay, "--to", str(day + 6 * 3600), "--out", str(tmp / "releases.jsonl")]) == 0
    html_path = tmp / "report.html"
    report = ["budget", "report", "--scope", "web-daily", "--topology", str(EXAMPLE), "--redis", url]
    assert main([*report, "--html", str(html_path)]) == 0
    client.flushdb()
    return html_path, {"tmp": tmp}


def test_page_is_self_contained(page: tuple[Path, dict[str, Any]]) -> None:
    """One file: no script, no stylesheet link, no src/href to anything (SVG namespaces are not fetched)."""
    text = page[0].read_text(encoding="utf-8")
    assert "<script" not in text.lower() and "<link" not in text.lower() and "<img" not in text.lower()
    assert not re.search(r"""(src|href)\s*=\s*["'](?!#)""", text)
    assert text.count("<figure data-plot=") == 4 and text.count("<svg") == 4


def test_every_plot_renders_in_headless_chromium(page: tuple[Path, dict[str, Any]], chromium: str) -> None:
    """In Chromium each of the four plots is a non-empty image with ink, and the page logs no console
    message and fails no load; a screenshot of the page is kept next to it."""
    from dpstream.workers.report.page import PLOTS

    html_path, extra = page
    text = html_path.read_text(encoding="utf-8")
    probed = extra["tmp"] / "probed.html"
    probed.write_text(text.replace("<head>", "<head>" + _HEAD, 1).replace("</body>", _BODY + "</body>", 1))
    run = _chromium(
        chromium,
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=20000",
        "--window-size=1100,3000",
        "--dump-dom",
        probed.as_uri(),
    )
    found = re.search(r'<pre id="probe">(.*?)</pre>', run.stdout, re.S)
    assert found, (run.returncode, run.stderr[-2000:])
    probe = json.loads(found[1].replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))
    assert "fatal" not in probe, probe
    assert probe["errors"] == []
    consoles = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    assert consoles == []
    assert set(probe["plots"]) == set(PLOTS)
    for name, fig in probe["plots"].items():
        assert fig["width"] > 200 and fig["height"] > 100, (name, fig)
        assert fig["ink"] > 0.01 * fig["pixels"], (name, fig)  # axes, labels and data: not a blank image
    shot = html_path.with_suffix(".png")
    run = _chromium(chromium, f"--screenshot={shot}", "--window-size=1100,3000", html_path.as_uri())
    assert shot.exists() and shot.stat().st_size > 10_000, run.stderr[-2000:]
    print(f"screenshot: {shot}")
