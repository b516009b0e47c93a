"""The release protocol (DESIGN §4, §6): deterministic ids, the record, quote → noise → reserve → publish → commit."""

from workers.release.ids import release_id
from workers.release.outcomes import ReleaseCounts, ReleaseOutcome, ReleaseResult
from workers.release.record import RATIO_PLACEHOLDER, build_record, canonical_bytes, true_values_for
from workers.release.releaser import Publish, Releaser, sweep

__all__ = [
    "RATIO_PLACEHOLDER",
    "Publish",
    "ReleaseCounts",
    "ReleaseOutcome",
    "ReleaseResult",
    "Releaser",
    "build_record",
    "canonical_bytes",
    "release_id",
    "sweep",
    "true_values_for",
]
