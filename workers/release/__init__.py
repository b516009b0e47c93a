"""The release protocol (DESIGN §4, §6): deterministic ids, the record, quote → noise → reserve → publish → commit."""

from dpstream.workers.release.ids import release_id
from dpstream.workers.release.outcomes import ReleaseCounts, ReleaseOutcome, ReleaseResult
from dpstream.workers.release.record import RATIO_PLACEHOLDER, build_record, canonical_bytes, true_values_for
from dpstream.workers.release.releaser import Publish, Releaser, sweep

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
