"""Arrows point down (DESIGN §2): the shipped layers never import the CLI or the checkout-only tools,
topology imports no I/O.

Static, with `ast`, over every module file: module-level and function-local imports, relative
imports, and `importlib.import_module("…")` / `__import__("…")` with a literal name all count.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKERS = ROOT / "workers"
TOPOLOGY = ROOT / "topology"

NAMED_LAYERS = ("runtime", "pipeline", "release", "ledger", "noise")
"""The layers the rule names; every other package of the wheel is held to the same rule."""

ABOVE = ("commands", "localstack", "demo", "bench")
"""What the layers may not import: the CLI's command modules and the tools that need a checkout."""

IO_LIBRARIES = ("kafka", "aiokafka", "confluent_kafka", "faust", "mode", "redis")
"""Kafka, Faust and Redis clients: topology/ is pure arithmetic and loading."""


def imported_modules(source: str, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, absolute dotted name) of everything `source` imports, wherever the import statement sits.

    `module` is the file's own dotted name (for relative imports); `from a import b` yields both
    `a` and `a.b`, since b may be a submodule.
    """
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - (node.level - 1)])
                base = f"{anchor}.{base}" if base else anchor
            yield node.lineno, base
            for alias in node.names:
                if alias.name != "*":
                    yield node.lineno, f"{base}.{alias.name}"
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                yield node.lineno, node.args[0].value


def _canonical(name: str) -> str:
    """`dpstream.workers.x` and the pre-rename `workers.x` are the same module for the rule."""
    return name.removeprefix("dpstream.")


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def upward_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """Imports of commands/localstack/demo/bench in a module of a lower layer (line: name)."""
    return [
        f"{line}: {name}"
        for line, name in imported_modules(source, module, is_package)
        if any(_within(_canonical(name), f"workers.{above}") for above in ABOVE)
    ]


def topology_violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """Imports of dpstream.workers or of a Kafka/Faust/Redis client in topology/ (line: name)."""
    return [
        f"{line}: {name}"
        for line, name in imported_modules(source, module, is_package)
        if _within(_canonical(name), "workers") or name.split(".")[0] in IO_LIBRARIES
    ]


def _modules(folder: Path, dotted: str) -> list[tuple[Path, str, bool]]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder).with_suffix("").parts
        is_package = rel[-1] == "__init__"
        parts = rel[:-1] if is_package else rel
        found.append((path, ".".join((dotted, *parts)), is_package))
    return found


def _layer_packages() -> list[str]:
    """Every package under workers/ but the CLI's commands and the checkout tools (the named layers first)."""
    others = sorted(
        p.parent.name for p in WORKERS.glob("*/__init__.py") if p.parent.name not in (*ABOVE, *NAMED_LAYERS)
    )
    return [*NAMED_LAYERS, *others]


@pytest.mark.parametrize("layer", _layer_packages())
def test_layer_imports_no_commands_and_no_checkout_tools(layer: str) -> None:
    """No module of the layer imports commands, localstack, demo or bench, not even inside a function."""
    modules = _modules(WORKERS / layer, f"dpstream.workers.{layer}")
    assert modules, f"workers/{layer} has no modules"
    problems = [
        f"{path.relative_to(ROOT)}:{hit}"
        for path, module, is_package in modules
        for hit in upward_imports(path.read_text(encoding="utf-8"), module, is_package)
    ]
    assert not problems, "imports pointing up (move the code down, or invert the call):\n" + "\n".join(problems)


@pytest.mark.parametrize("tool", ["localstack", "demo", "bench"])
def test_checkout_tools_import_no_commands(tool: str) -> None:
    """The tools sit under the CLI: `dpstream demo`/`bench` call them, they never import a command module."""
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path, module, is_package in _modules(WORKERS / tool, f"dpstream.workers.{tool}")
        for line, name in imported_modules(path.read_text(encoding="utf-8"), module, is_package)
        if _within(_canonical(name), "workers.commands")
    ]
    assert not problems, "a tool imports the CLI (move what it needs down, e.g. into the ledger):\n" + "\n".join(
        problems
    )


def test_topology_imports_no_workers_and_no_io_clients() -> None:
    """topology/ is pure: it imports neither dpstream.workers nor kafka/aiokafka/faust/redis clients."""
    modules = _modules(TOPOLOGY, "dpstream.topology")
    assert len(modules) > 5
    problems = [
        f"{path.relative_to(ROOT)}:{hit}"
        for path, module, is_package in modules
        for hit in topology_violations(path.read_text(encoding="utf-8"), module, is_package)
    ]
    assert not problems, "topology/ must stay pure:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import dpstream.workers.localstack\n", ["1: dpstream.workers.localstack"]),
        (
            "def f():\n    from dpstream.workers.commands.budget import status_json\n",
            ["2: dpstream.workers.commands.budget", "2: dpstream.workers.commands.budget.status_json"],
        ),
        ("from dpstream.workers import demo\n", ["1: dpstream.workers.demo"]),
        ("from ..bench import noise\n", ["1: dpstream.workers.bench", "1: dpstream.workers.bench.noise"]),
        ("from .. import commands\n", ["1: dpstream.workers.commands"]),
        ("import importlib\nimportlib.import_module('dpstream.workers.demo.run')\n", ["2: dpstream.workers.demo.run"]),
        ("import workers.localstack.kafka\n", ["1: workers.localstack.kafka"]),
        ("from dpstream.workers.runtime.admin import create_topics\nimport dpstream.workers.benchmarks\n", []),
    ],
)
def test_the_checker_sees_every_form_of_import(source: str, expected: list[str]) -> None:
    """Module-level, function-local, `from package import submodule`, relative and importlib imports are all caught."""
    assert upward_imports(source, "dpstream.workers.runtime.topics") == expected


def test_the_topology_checker_sees_io_clients_and_workers() -> None:
    """A function-local redis import or a workers import in topology/ is caught; the standard library is not."""
    source = "import json\ndef f():\n    import redis.asyncio\n    from dpstream.workers.ledger import open_ledger\n"
    assert topology_violations(source, "dpstream.topology.plan") == [
        "3: redis.asyncio",
        "4: dpstream.workers.ledger",
        "4: dpstream.workers.ledger.open_ledger",
    ]
