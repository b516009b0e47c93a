"""Generate deploy/grafana/dashboards/*.json from Python with grafana-foundation-sdk.

    python deploy/grafana/dashboards.py           # write every dashboard
    python deploy/grafana/dashboards.py --check   # exit 1 if a checked-in file differs from its source

The dashboards are code (one module per dashboard beside this file, built from _panels.py); the JSON
files are their output, kept in the repository because Grafana's file provisioning reads them. Output
is deterministic: keys sorted, two-space indent, UTF-8, one trailing newline.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "dashboards"
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _budget  # noqa: E402
import _feed  # noqa: E402
import _ingest  # noqa: E402
import _ledger  # noqa: E402
import _releases  # noqa: E402
from grafana_foundation_sdk.builders import dashboard as db  # noqa: E402  (after the sys.path line above)
from grafana_foundation_sdk.cog.encoder import JSONEncoder  # noqa: E402

BUILDERS: dict[str, Callable[[], db.Dashboard]] = {
    module.UID: module.build for module in (_budget, _releases, _ingest, _ledger, _feed)
}
"""uid -> builder; the file is dashboards/<uid>.json."""


def render(builder: Callable[[], db.Dashboard]) -> str:
    """The dashboard as the checked-in JSON text."""
    model = json.loads(json.dumps(builder().build(), cls=JSONEncoder))
    return json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def rendered() -> dict[Path, str]:
    """Every dashboard file and its text."""
    return {OUT / f"{uid}.json": render(builder) for uid, builder in BUILDERS.items()}


def stale() -> list[Path]:
    """Files whose checked-in text is not what their source renders (or that are missing)."""
    return [path for path, text in rendered().items() if not path.is_file() or path.read_text("utf-8") != text]


def main(argv: list[str] | None = None) -> int:
    """Write the dashboards, or with --check report the stale ones and exit 1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a file differs instead of writing it")
    args = parser.parse_args(argv)
    if args.check:
        paths = stale()
        for path in paths:
            print(f"stale: {path.relative_to(HERE.parents[1])} (run python deploy/grafana/dashboards.py)")
        return 1 if paths else 0
    for path, text in rendered().items():
        path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
