"""The `dpstream` command line: a thin dispatcher over `dpstream.workers.commands.*`.

Each subcommand lives in its own module with a `register(subparsers)` function that adds its
parser and sets `func(args) -> int`. User mistakes (`ConfigError`) print one line and exit 2;
nothing a user can fix ever shows a traceback.

Every name in `COMMANDS` must have its module: a missing one is a bug and fails every command
with one line, it never silently drops the command. `demo` and `bench` run tools that need a
checkout of the repository (`dpstream.workers.demo`, `.bench` and `.localstack` are not in the
wheel); installed from a wheel, they stay listed and fail with one line that says so.
"""

from __future__ import annotations

__all__ = ["main", "build_parser"]

import argparse
import importlib
import importlib.util
import os
import signal
import sys

from dpstream.topology.errors import ConfigError, DpstreamError, InternalError

COMMANDS = (
    "validate",
    "plan",
    "schema",
    "worker",
    "exporter",
    "tail",
    "replay",
    "produce",
    "demo",
    "budget",
    "breaker",
    "audit_privacy",
    "verify",
    "bench",
)
"""Modules under dpstream.workers.commands, in `dpstream --help` order (`audit_privacy` is `audit-privacy`)."""

NEEDS_CHECKOUT = {
    "demo": (
        "dpstream.workers.demo",
        "it runs the local stack from deploy/local/ (Kafka jars via deploy/local/pom.xml, config templates)",
    ),
    "bench": (
        "dpstream.workers.bench",
        "the benchmarks (and the local stack `bench pipeline` starts) are not in the wheel",
    ),
}
"""Commands whose tools are left out of the wheel: the package each needs, and why."""


def needs_checkout_message(command: str) -> str:
    """The one line a checkout-only command prints when dpstream is installed from a wheel."""
    return (
        f"dpstream {command} needs a checkout of the repository: {NEEDS_CHECKOUT[command][1]}; "
        "clone it and run `pip install -e .` there"
    )


def _register_needs_checkout(subparsers: argparse._SubParsersAction, command: str) -> None:
    """A stand-in for a checkout-only command: listed in --help, fails with one line whatever its arguments
    (`main` lets it take any, `--help` included)."""
    parser = subparsers.add_parser(command, help="(needs a checkout of the repository)", add_help=False)

    def fail(args: argparse.Namespace) -> int:
        print(needs_checkout_message(command), file=sys.stderr)
        return 2

    parser.set_defaults(func=fail, needs_checkout=True)


def build_parser() -> argparse.ArgumentParser:
    """The full parser; raises InternalError when a module of `COMMANDS` is missing."""
    parser = argparse.ArgumentParser(
        prog="dpstream",
        description="Differentially private metrics from Kafka streams, with an atomic privacy-budget ledger.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        tool = NEEDS_CHECKOUT.get(name)
        if tool is not None and importlib.util.find_spec(tool[0]) is None:
            _register_needs_checkout(subparsers, name)
            continue
        module_name = f"dpstream.workers.commands.{name}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise  # a missing dependency: its own message says which
            raise InternalError(
                f"command module {module_name} is missing (this is a bug: COMMANDS names it; reinstall dpstream "
                "or report it)"
            ) from None
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `dpstream` console script; returns the process exit code."""
    try:
        parser = build_parser()
    except InternalError as exc:
        print(f"dpstream: InternalError: {exc}", file=sys.stderr)
        return 1
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "needs_checkout", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"dpstream: error: {_config_error_line(exc, args)}", file=sys.stderr)
        return 2
    except DpstreamError as exc:
        print(f"dpstream: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_gone()


def _config_error_line(exc: ConfigError, args: argparse.Namespace) -> str:
    """The one line of a user mistake; a refused volatile ledger suggests `--allow-volatile` only to a
    command that has the flag (`worker`, `replay` have none: they say how to make the Redis durable)."""
    from dpstream.workers.ledger.durability import NotDurable  # imported on this error path only: it is heavy

    if isinstance(exc, NotDurable) and hasattr(args, "allow_volatile"):
        return exc.with_flag_hint()
    return str(exc)


def _reader_gone() -> int:
    """Stdout's reader went away (`dpstream replay … | head`): stop quietly, as a tool killed by
    SIGPIPE would (exit 141), with stdout pointed at /dev/null so that the interpreter's final
    flush does not fail again with a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
