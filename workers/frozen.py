"""`FrozenFields`: read-only record metadata, shared by every release of a mechanism at one cost.

Its own module, imported by the noise layer that makes it and the record that encodes it, so that
neither pulls in the other (the record's import stays free of OpenDP).
"""

from __future__ import annotations

__all__ = ["FrozenFields"]

from typing import Any, NoReturn


class FrozenFields(dict[str, Any]):
    """A read-only flat dict of record metadata (noise, ci, post-processing flags) that a mechanism
    hands, as the same object, to every release at its cost: the record encodes its text once and
    knows it by identity. It is a dict (the JSON encoder and `==` take it as one); writes raise."""

    __slots__ = ()

    def _read_only(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("release metadata is shared by every release at this cost: copy it to change it")

    # every writer of dict refuses
    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = __ior__ = _read_only

    def __reduce__(self) -> tuple[type, tuple[dict[str, Any]]]:
        """Pickle and copy rebuild it from a plain dict (dict's own way sets items one by one)."""
        return (FrozenFields, (dict(self),))
