"""Prometheus telemetry (DESIGN §7): what a worker and `dpstream exporter` serve on `/metrics`.

- `budget`: budget gauges per scope, read from the ledger at scrape time (every worker and the
  exporter serve them), and `dpstream_ledger_up`;
- `worker`: the release and ingest counters a worker keeps in process (per metric, per source);
- `ledger_proxy`: the timing proxy around the release side's ledger (per op);
- `histogram`: the small labelled histograms those two fill;
- `web`: the per-process registry, the Faust pages `/metrics` and `/health`;
- `exporter`: the aiohttp server of `dpstream exporter`.

Metrics are curator-side (DESIGN §1 "Trust boundary"), and still carry no raw value, no true
aggregate, no unit id and no key taken from the data: labels are topology names (scope, metric,
source), fixed vocabularies (outcome, reason, op, state, currency) and versions. Submodules are
imported where used, so importing this package stays cheap.
"""
