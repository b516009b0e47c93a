"""Where the local stack keeps its state: one directory, `~/.cache/dpstream` unless `DPSTREAM_HOME` says otherwise."""

from __future__ import annotations

__all__ = ["default_home", "repo_deploy_dir", "template_path", "render_template", "tail"]

import os
import string
from pathlib import Path

from dpstream.topology.errors import ConfigError, InternalError

_HOME_ENV = "DPSTREAM_HOME"


def default_home() -> Path:
    """The state directory: `$DPSTREAM_HOME` if set, else `~/.cache/dpstream`."""
    override = os.environ.get(_HOME_ENV, "").strip()
    if override:
        return Path(override).expanduser().resolve()
    return (Path.home() / ".cache" / "dpstream").resolve()


def repo_deploy_dir() -> Path:
    """`deploy/local/` of this checkout (the stack is run from an editable install, as the README says)."""
    here = Path(__file__).resolve().parents[2] / "deploy" / "local"
    if not (here / "pom.xml").is_file():
        raise ConfigError(
            f"{here}/pom.xml: not found: the local stack runs from a source checkout; "
            "install it with `pip install -e '.[dev]'` from the repository root"
        )
    return here


def template_path(name: str) -> Path:
    """Path of one config template under `deploy/local/templates/`."""
    return repo_deploy_dir() / "templates" / name


def render_template(name: str, **fields: object) -> str:
    """Fill a `deploy/local/templates/` file's `${field}`s; a missing field is a bug, not a user mistake."""
    text = template_path(name).read_text(encoding="utf-8")
    try:
        return string.Template(text).substitute({key: str(value) for key, value in fields.items()})
    except (KeyError, ValueError) as exc:
        raise InternalError(f"template {name}: field {exc} not supplied (this is a bug)") from exc


def tail(path: Path, lines: int = 25) -> str:
    """The last `lines` lines of a log file, or a note that there is none yet."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    kept = text.splitlines()[-lines:]
    return "\n".join(kept) if kept else f"(empty log at {path})"
