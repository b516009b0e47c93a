"""`Codes`: a string keeps its code while held, pruning renumbers in order, and each code's digest is
its string's `unit_key` however the table grew and was pruned."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.workers.pipeline.codes import Codes
from dpstream.workers.pipeline.window_caps import unit_key

pytestmark = pytest.mark.unit


class _Holder:
    """A code user holding the codes of the strings it was last given."""

    def __init__(self, codes: Codes) -> None:
        self.held = np.zeros(0, np.int64)
        codes.attach(self)

    def held_codes(self, codes: Codes) -> list[np.ndarray]:
        return [self.held]

    def renumber(self, codes: Codes, mapping: np.ndarray) -> None:
        self.held = mapping[self.held]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.text(max_size=3), max_size=12, unique=True), st.booleans()), max_size=12))
def test_digests_are_the_unit_keys_of_the_strings_held(steps):
    """Batches of strings coded, some hashed, the table pruned at a tiny floor: every held code names
    its string, and its digest is that string's unit_key."""
    codes = Codes(floor=2)
    holder = _Holder(codes)
    for strings, hash_them in steps:
        holder.held = codes.of(strings)
        if hash_them and strings:
            assert codes.digests(holder.held).tolist() == [unit_key(s) for s in strings]
        codes.prune()
        assert [codes.names[c] for c in holder.held.tolist()] == strings
        assert codes.digests(holder.held).tolist() == [unit_key(s) for s in strings]
