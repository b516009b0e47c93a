"""`dpstream breaker open|close --scope S --reason "…"`: an operator stops or resumes a scope's releases.

A manually opened breaker refuses every release until an operator closes it (it survives period
rollover); closing also clears an automatic open. Both go to the audit trail with actor and reason.
"""

from __future__ import annotations

__all__ = ["register"]

import argparse
import asyncio
import json

from dpstream.workers.commands.budget import add_ledger_args, default_actor, open_cli_ledger


def _act(args: argparse.Namespace) -> int:
    async def main() -> int:
        ledger, _ = await open_cli_ledger(args)
        try:
            if args.action == "open":
                changed = await ledger.open_breaker(args.scope, args.reason, args.actor)
            else:
                changed = await ledger.close_breaker(args.scope, args.reason, args.actor)
            state = (await ledger.status(args.scope)).state.value
        finally:
            await ledger.close()
        if args.json:
            print(json.dumps({"scope": args.scope, "action": args.action, "changed": changed, "state": state}))
        else:
            verb = "opened" if args.action == "open" else "closed"
            print(
                f"{args.scope}: breaker {verb}" if changed else f"{args.scope}: breaker was already {verb}",
                f"(state now {state})",
            )
        return 0

    return asyncio.run(main())


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `breaker open|close`."""
    parser = subparsers.add_parser("breaker", help="open or close a budget scope's circuit breaker (audited)")
    parser.add_argument("action", choices=("open", "close"))
    parser.add_argument("--scope", required=True)
    parser.add_argument("--reason", required=True, help="why (goes to the audit trail)")
    parser.add_argument("--actor", default=default_actor(), help="who (default $USER)")
    add_ledger_args(parser)
    parser.set_defaults(func=_act)
