"""The CLI's command table (workers/cli.py): every listed command loads, a missing one fails loudly,
checkout tools say so."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest

from dpstream.workers import cli

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_listed_command_has_its_module() -> None:
    """Each name in COMMANDS imports and registers a subcommand (a command is listed only once it exists)."""
    for name in cli.COMMANDS:
        assert callable(importlib.import_module(f"dpstream.workers.commands.{name}").register)
    parser = cli.build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(commands.choices) == {name.replace("_", "-") for name in cli.COMMANDS}


def test_readme_lists_only_commands_that_exist() -> None:
    """Every `dpstream X` row of the README's command table is a command of the CLI (no promised `verify`)."""
    rows = re.findall(r"^\| `dpstream ([a-z-]+)", README.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert rows
    assert set(rows) <= {name.replace("_", "-") for name in cli.COMMANDS}


def test_a_missing_command_module_fails_every_command_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A COMMANDS entry without its module is a bug: exit 1 and one line naming it, never a silently missing command."""
    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, "no_such_command"))
    assert cli.main(["plan", "--help"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dpstream.workers.commands.no_such_command is missing" in err[0]


@pytest.mark.parametrize("argv", [["demo"], ["demo", "--help"], ["demo", "--duration", "5"], ["bench", "noise"]])
def test_checkout_tools_missing_fail_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """Without the demo/bench packages (a wheel install), the command stays listed and exits 2 with one line."""
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name in ("dpstream.workers.demo", "dpstream.workers.bench") else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [cli.needs_checkout_message(argv[0])]
    assert err[0].startswith(f"dpstream {argv[0]} needs a checkout of the repository: ")


def test_unknown_arguments_of_a_real_command_are_still_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Only the checkout stand-ins swallow arguments: a real command keeps argparse's error (exit 2)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(["schema", "--no-such-flag"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err
