"""dpstream from Python: the operations of the `dpstream` CLI, with typed values.

    import dpstream
    from datetime import UTC, datetime

    topology = dpstream.validate("topology/examples/web-analytics.yaml").topology  # mistakes: ConfigError
    print(dpstream.plan(topology).scopes["web-daily"].cap)  # Rho(0.0241296): the scope's cap per period
    events = [{"user_id": "u1", "ts": 1764460805, "page": "home"}]  # dicts or JSON bytes, one event each
    start, end = datetime(2026, 11, 30, tzinfo=UTC), datetime(2026, 11, 30, 1, tzinfo=UTC)  # public
    with dpstream.open_ledger("memory", topology, now=end) as ledger:
        for release in dpstream.replay(topology, events, start=start, end=end, ledger=ledger):
            print(release.metric, release.window_start, release.values, release.cost)
        print(ledger.status("web-daily").spent)  # Rho(0.000790915): what the hour's releases spent

What it offers:

- `load_topology(path)`, `validate(path)`: read and check a topology file (every mistake is a
  one-line `ConfigError` naming FILE:LINE, the field and the fix; `validate` adds the warnings).
- `plan(topology)`: the budget plan (`dpstream plan`): per scope its cap, reserve, pool and the
  cost of one release of each metric, as `Rho` or `Epsilon`.
- `replay(topology, events, start=, end=)`: the worker's pipeline over an iterable of events
  (dicts or JSON bytes), releasing every window of the public schedule [start, end), with an
  in-process or Redis ledger (`dpstream replay`); returns the `Release` records. `replay_async`
  is the same for async code.
- `open_ledger(where, topology)`: an in-process (`"memory"`) or Redis ledger; its
  `status(scope)` says where a scope's budget stands (`dpstream budget status`) as a
  `BudgetStatus`.
- `Rho`, `Epsilon`: costs in a scope's currency (ρ for zCDP scopes, ε for pure ones), never bare
  floats.

`dpstream.topology` (the model and its privacy arithmetic) and `dpstream.workers` (the runtime,
the ledger, the CLI) are the packages underneath. Importing `dpstream` loads neither's heavy
modules; each function imports what it calls.
"""

from __future__ import annotations

if __name__ != "dpstream":  # an editable install maps workers/ to dpstream.workers, so this folder has two names
    raise ImportError(f"{__name__} is the module `dpstream` itself: `import dpstream`")

__all__ = [
    "BudgetStatus",
    "ConfigError",
    "ConfigWarning",
    "Cost",
    "Epsilon",
    "Ledger",
    "Plan",
    "PlannedScope",
    "Release",
    "Replay",
    "Rho",
    "Topology",
    "Validation",
    "load_topology",
    "open_ledger",
    "plan",
    "replay",
    "replay_async",
    "validate",
]

from typing import TYPE_CHECKING, Any

from dpstream.topology.errors import ConfigError, ConfigWarning

from ._costs import Cost, Epsilon, Rho
from ._ledger import BudgetStatus, Ledger, open_ledger
from ._replay import Release, Replay, replay, replay_async
from ._topology import Plan, PlannedScope, Validation, load_topology, plan, validate

if TYPE_CHECKING:
    from dpstream.topology.model import Topology


def __getattr__(name: str) -> Any:
    """`dpstream.Topology`, imported on first use (the model is not needed to start the CLI)."""
    if name == "Topology":
        from dpstream.topology.model import Topology

        return Topology
    raise AttributeError(f"module 'dpstream' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
