"""`NoisyRelease`: the noisy values of one window plus the noise metadata of the release record."""

from __future__ import annotations

__all__ = ["FrozenFields", "NoisyRelease", "apply_postprocess"]

from typing import TYPE_CHECKING, Any, NamedTuple

from dpstream.topology.model import PostProcess
from dpstream.workers.frozen import FrozenFields

if TYPE_CHECKING:
    from dpstream.workers.release.event import PrivacyEvent


class NoisyRelease(NamedTuple):
    """What one release publishes (values, mechanism, noise, ci of the record) and what it cost.

    `values` maps each released key to its noisy value ('' for an ungrouped metric); a top-k
    release has `keys` in rank order and empty `values`. `noise` is {scale, stddev} in value
    units, or {component: {scale, stddev}} when several noisy parts make up the value.
    `ci` is {level, half_width}: the half-width is one number for every key, except for a
    noisy-ratio mean, where it is an approximate per-key dict (see `workers.noise.mechanisms`).
    `event` is the mechanism's privacy event at this cost (the record's `event`). A named tuple:
    one is built per release, at tuple speed.
    """

    values: dict[str, float]
    mechanism: str
    noise: dict[str, Any]
    ci: dict[str, Any] | None
    cost: float
    postprocess: dict[str, bool] = FrozenFields()
    keys: tuple[str, ...] = ()
    partition_selection: dict[str, Any] | None = None
    event: PrivacyEvent | None = None

    def to_record_fields(self) -> dict[str, Any]:
        """The release-record fields this object owns, as plain JSON-able values (a mechanism's
        `FrozenFields` as they are: read-only, so no copy is needed)."""
        noise, ci, postprocess = self.noise, self.ci, self.postprocess
        fields: dict[str, Any] = {
            "values": dict(self.values),
            "mechanism": self.mechanism,
            "noise": noise if type(noise) is FrozenFields else _plain(noise),
            "ci": ci if type(ci) is FrozenFields else _plain(ci),
            "postprocess": postprocess if type(postprocess) is FrozenFields else dict(postprocess),
        }
        if self.keys or self.mechanism.startswith("noisy_top_k"):
            fields["keys"] = list(self.keys)
        if self.partition_selection is not None:
            fields["partition_selection"] = _plain(self.partition_selection)
        if self.event is not None:
            fields["event"] = self.event.fields
        return fields


_SCALARS = (str, float, int, bool, type(None))


def _plain(obj: Any) -> Any:
    """`obj` as JSON-able plain values: dicts with str keys, lists for tuples (scalars as they are)."""
    if type(obj) in _SCALARS:
        return obj
    if type(obj) is dict and all(type(k) is str and type(v) in _SCALARS for k, v in obj.items()):
        return dict(obj)  # a flat dict of scalars (noise, ci): a copy is its plain form
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def apply_postprocess(values: dict[str, float], options: PostProcess) -> tuple[dict[str, float], dict[str, bool]]:
    """Round and/or clamp at 0 (free post-processing); returns the values (`values` itself when there
    is nothing to do, else a new dict) and the flags applied."""
    out = values if not (options.clamp_zero or options.round) else dict(values)
    if options.clamp_zero:
        out = {k: max(0.0, v) for k, v in out.items()}
    if options.round:
        out = {k: float(round(v)) for k, v in out.items()}
    return out, {"round": options.round, "clamp_zero": options.clamp_zero}
