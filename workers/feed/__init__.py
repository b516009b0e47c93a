"""The feed: reading the public releases topic back (dedupe by release_id, the first record wins),
for `dpstream tail` and the exporter's released-value series."""
