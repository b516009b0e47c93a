"""`Codes`: dense integer codes for the strings bounding sorts on (a partition's unit ids, a metric's keys).

Bounding works on arrays, so a unit or a key is an int64 code while its window is open; the code is
a position in `names`, the same for every batch while the string is held. Codes are never part of a
result: a window's partial names its keys by string, and key priority and period state hash the unit's
own id. `prune` drops the strings no open window holds any more and renumbers the rest, so the table
stays about as large as what open windows hold.
"""

from __future__ import annotations

__all__ = ["Codes", "CodeUser"]

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from dpstream.workers.pipeline.window_caps import unit_key


class CodeUser(Protocol):
    """What holds codes of a `Codes`: it lists the codes it holds, and renumbers them when told to."""

    def held_codes(self, codes: Codes) -> list[np.ndarray]: ...

    def renumber(self, codes: Codes, mapping: np.ndarray) -> None: ...


class Codes:
    """String → dense int64 code, shared by every `CodeUser` attached (the metrics of one partition)."""

    def __init__(self, floor: int = 1 << 16) -> None:
        """`floor`: no pruning while fewer strings than this are held."""
        self._code: dict[str, int] = {}
        self.names: list[str] = []
        """The string of each code."""
        self._digests = np.empty(0, object)
        """`unit_key` of each code's string once asked for (None before), with room to grow."""
        self._users: list[CodeUser] = []
        self._prune_at = floor
        self._floor = floor
        self.generation = 0
        """Bumped by every prune (codes handed out before it are stale)."""

    def __len__(self) -> int:
        return len(self.names)

    def attach(self, user: CodeUser) -> None:
        """`user` holds codes of this table: it is asked for them, and renumbered, at each prune."""
        self._users.append(user)

    def of(self, distinct: Sequence[str]) -> np.ndarray:
        """The codes of `distinct` (no repeats), new strings numbered after the others."""
        self._register([s for s in distinct if s not in self._code])
        return np.fromiter(map(self._code.__getitem__, distinct), np.int64, len(distinct))

    def column(self, strings: Sequence[str]) -> np.ndarray:
        """The code of each of `strings` (repeats allowed), new strings numbered after the others in
        their order of first appearance."""
        code = self._code
        self._register([s for s in dict.fromkeys(strings) if s not in code])
        return np.fromiter(map(code.__getitem__, strings), np.int64, len(strings))

    def _register(self, new: list[str]) -> None:
        """Number the strings `new` (distinct, none held yet) after the others."""
        if not new:
            return
        first = len(self.names)
        self._code.update(zip(new, range(first, first + len(new)), strict=True))
        self.names.extend(new)
        if len(self.names) > len(self._digests):
            grown = np.empty(max(2 * len(self._digests), len(self.names), 1024), object)
            grown[: len(self._digests)] = self._digests
            self._digests = grown

    def digests(self, codes: np.ndarray) -> np.ndarray:
        """`window_caps.unit_key` of each code's string (an object array), hashed once per string while held."""
        got = self._digests[codes]
        missing = np.flatnonzero(~got.astype(bool))  # None where not hashed yet (a key is 16 bytes)
        if len(missing):
            names = self.names
            for c in np.unique(codes[missing]).tolist():
                self._digests[c] = unit_key(names[c])
            got = self._digests[codes]
        return got

    def prune(self) -> None:
        """When the table has doubled since the last prune (and holds at least the floor): keep only the
        strings some user still holds, renumbered densely in their old order."""
        if len(self.names) < self._prune_at:
            return
        held = np.zeros(len(self.names), bool)
        for user in self._users:
            for codes in user.held_codes(self):
                held[codes] = True
        live = np.flatnonzero(held)
        mapping = np.full(len(self.names), -1, np.int64)
        mapping[live] = np.arange(len(live), dtype=np.int64)
        kept = live.tolist()
        self.names = [self.names[c] for c in kept]
        digests = np.empty(max(2 * len(kept), 1024), object)
        digests[: len(kept)] = self._digests[live]
        self._digests = digests
        self._code = dict(zip(self.names, range(len(kept)), strict=True))
        self.generation += 1
        for user in self._users:
            user.renumber(self, mapping)
        self._prune_at = max(self._floor, 2 * len(kept))
