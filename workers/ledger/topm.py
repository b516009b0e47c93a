"""The period bound of `contribution.max_windows: m`: a period pays only a metric's m largest charges.

A unit counts in at most m windows of the metric per period (the pipeline includes it in its first
m windows present, in the public close order), so a neighbour pair differs in at most m of the
metric's releases: the metric's worst-case spend in a period is the sum of its m largest charges
(an individual privacy filter, Feldman & Zrnic 2021, at every Rényi order for ρ-zCDP; basic
composition for pure ε). The ledger keeps those m charges per (metric, topology version, period)
in the period block's field `top:<metric>:<version>` (units, largest first, space-separated) and
charges a release by how much it raises their sum. Selection δ is charged in full (the plain sum).
"""

from __future__ import annotations

__all__ = ["field", "parse", "text", "raised", "lowered"]


def field(metric: str, topology_version: str) -> str:
    """The period block's field that holds the metric's largest charges under this topology version
    (each version's pipeline counts units afresh, so each version's m windows are paid: they add up)."""
    return f"top:{metric}:{topology_version}"


def parse(stored: str | None) -> tuple[int, ...]:
    """The stored largest charges (units, largest first); () for none."""
    return tuple(int(v) for v in stored.split()) if stored else ()


def text(top: tuple[int, ...]) -> str:
    """The stored form of `top`."""
    return " ".join(map(str, top))


def raised(top: tuple[int, ...], m: int, cost: int) -> tuple[int, tuple[int, ...]]:
    """(what a charge of `cost` adds to the sum of the m largest, the m largest after it): `cost`
    while fewer than m are charged, then max(0, cost − the m-th largest)."""
    after = tuple(sorted((*top, cost), reverse=True)[:m])
    return sum(after) - sum(top[:m]), after


def lowered(top: tuple[int, ...], cost: int, paid: int) -> tuple[int, ...]:
    """The m largest before a charge of `cost` that raised their sum by `paid` (`raised` undone): unchanged
    when it raised nothing; else without that charge, and with the one it pushed out (cost − paid) back."""
    if paid <= 0 or cost not in top:
        return top
    rest = list(top)
    rest.remove(cost)
    if paid < cost:
        rest.append(cost - paid)
    return tuple(sorted(rest, reverse=True))
