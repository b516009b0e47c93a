"""A ledger namespace's id: created once, carried by every release record charged to it.

One releases topic must be fed by one ledger, or a process with a missing or mistyped namespace
(a fresh, empty budget) could publish a second noisy value for a known release_id. So each ledger
namespace gets a random id the first time anything asks for it (`SET NX`: the first writer wins,
every later open reads the same id), every record names it in its `ledger` field, a worker refuses
to start against a releases topic holding records of its topology version from another ledger id,
and `dpstream verify` reports such records. The in-process ledger (`replay`'s default, tests) has
no id: it ends with its process, so its records say `"ledger": null`, charged to no ledger.
"""

from __future__ import annotations

__all__ = ["NO_LEDGER_NOTE", "new_ledger_id", "check_ledger_id"]

import re
import secrets

from dpstream.topology.errors import InternalError

_ID = re.compile(r"[0-9a-f]{32}")

NO_LEDGER_NOTE = 'records carry "ledger": null: charged to no ledger (the in-process one ends with this process)'
"""What `replay` says on stderr when its records were charged to the in-process ledger."""


def new_ledger_id() -> str:
    """A fresh id to propose (`SET NX`): 32 hex digits from the OS's CSPRNG."""
    return secrets.token_hex(16)


def check_ledger_id(value: str, where: str) -> str:
    """`value` if it is an id this module makes; InternalError otherwise (only `SET NX` writes it)."""
    if not _ID.fullmatch(value):
        raise InternalError(f"{where}: ledger id {value!r} is not 32 hex digits (this is a bug, or a foreign write)")
    return value
