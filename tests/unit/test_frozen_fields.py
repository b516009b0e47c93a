"""`FrozenFields`, the read-only metadata a mechanism shares between its releases: a dict to read,
to compare and to encode, refusing every write, and rebuilt whole by pickle and copy."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from dpstream.workers.frozen import FrozenFields

_WRITES: list[Callable[[dict[str, Any]], Any]] = [
    lambda d: d.__setitem__("scale", 1.0),
    lambda d: d.__delitem__("scale"),
    lambda d: d.update(scale=1.0),
    lambda d: d.pop("scale"),
    lambda d: d.popitem(),
    lambda d: d.clear(),
    lambda d: d.setdefault("grid_step", 1.0),
    lambda d: d.__ior__({"scale": 1.0}),
]


@pytest.mark.parametrize("write", _WRITES)
def test_every_write_is_refused_and_changes_nothing(write: Callable[[dict[str, Any]], Any]) -> None:
    frozen = FrozenFields(scale=2.0, stddev=2.5)
    with pytest.raises(TypeError, match="copy it to change it"):
        write(frozen)
    assert frozen == {"scale": 2.0, "stddev": 2.5}


def test_reads_compare_and_encode_as_the_plain_dict() -> None:
    plain = {"level": 0.95, "half_width": 377.0}
    frozen = FrozenFields(plain)
    assert frozen == plain and isinstance(frozen, dict)
    assert json.dumps(frozen, sort_keys=True) == json.dumps(plain, sort_keys=True)
    assert list(frozen.items()) == list(plain.items())
    assert frozen | {"x": 1} == {**plain, "x": 1}  # a new plain dict: the shared one is untouched
    assert type(frozen.copy()) is dict


@pytest.mark.parametrize("rebuild", [lambda f: pickle.loads(pickle.dumps(f)), copy.copy, copy.deepcopy])
def test_pickle_and_copy_rebuild_it_whole(rebuild: Callable[[FrozenFields], Any]) -> None:
    frozen = FrozenFields(scale=2.0, stddev=2.5, grid_step=0.5)
    again = rebuild(frozen)
    assert type(again) is FrozenFields and again == frozen
