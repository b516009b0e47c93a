"""The release protocol: exactly one noisy value per window (quote → noise → charge → publish → commit).

1. `release_id` = sha256 of (topology_version, metric, window_start, window_end): a restart with the
   same topology reproduces it; a changed topology is a new version and a new, charged release.
2. The `Releaser` merges the partials of every source partition, computes the true aggregate,
   draws noise (OpenDP samplers only) and builds the full record.
3. One atomic ledger call charges the cost with the payload: a known release_id returns the stored
   payload (the fresh noise is discarded); breaker open or budget short: refused and audited; a
   window older than the ledger's idempotency horizon: `expired`, never charged or noised again.
   A window straddling a period boundary is charged to every period it touches in the same call.
4. The stored payload is published (idempotent producer, key = release_id) no earlier than
   P(w) = C(w) + publish_delay, then committed (`published`). Never before the charge is durable;
   ledger unreachable: no release. Every release of a period is priced as in the public order
   (`ordering.order_key`: window end, P(w), metric), whichever ran first: the ones before it not
   charged yet as if they were, the ones after it charged already taken out (the ledger's backlog).
5. `sweep` republishes charged entries with the same stored bytes; consumers dedupe by release_id.

The record (`record`): release_id, topology_version, ledger (the ledger id), metric, window,
privacy_unit, values, mechanism, noise, cost, ci, bounds, contribution, budget {scope, period,
ratio_after}, published_at. A worker refuses a releases topic holding records of its topology
version from another ledger id (one releases topic, one ledger), and the release side holds
publication while the clock skew is past its bound.
"""

from dpstream.workers.release.ids import release_id
from dpstream.workers.release.outcomes import ReleaseCounts, ReleaseOutcome, ReleaseResult
from dpstream.workers.release.record import RATIO_PLACEHOLDER, canonical_bytes, record_bytes, true_values_for
from dpstream.workers.release.releaser import Publish, Releaser, sweep

__all__ = [
    "RATIO_PLACEHOLDER",
    "Publish",
    "ReleaseCounts",
    "ReleaseOutcome",
    "ReleaseResult",
    "Releaser",
    "canonical_bytes",
    "record_bytes",
    "release_id",
    "sweep",
    "true_values_for",
]
