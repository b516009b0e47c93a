"""The feed: reading the public releases topic back (dedupe by release_id, the first record wins),
for `dpstream tail` and the exporter's released-value series.

- `dedupe`: the one dedupe rule (first record per release_id wins; a later one that differs is a
  conflict, counted);
- `reader`: every partition of the topic from a topic time on, then following it;
- `start`: where reading starts (a metric's first window of its current period, `Schedule`);
- `latest`: each metric's latest release by window end, shown once its P(w) has passed.
"""

from dpstream.workers.feed.dedupe import Dedupe, Seen, Verdict, parse_record
from dpstream.workers.feed.latest import LatestReleases, key_bound_refusal, published_epoch
from dpstream.workers.feed.reader import FeedUnavailable, read_releases
from dpstream.workers.feed.start import feed_starts, period_first_window, seek_time

__all__ = [
    "Dedupe",
    "FeedUnavailable",
    "LatestReleases",
    "Seen",
    "Verdict",
    "feed_starts",
    "key_bound_refusal",
    "parse_record",
    "period_first_window",
    "published_epoch",
    "read_releases",
    "seek_time",
]
