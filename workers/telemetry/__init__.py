"""Prometheus telemetry: what a worker and `dpstream exporter` serve on `/metrics`.

- `budget`: budget gauges per scope, read from the ledger at scrape time (every worker and the
  exporter serve them), and `dpstream_ledger_up`;
- `worker`: the release and ingest counters a worker keeps in process (per metric, per source);
- `ledger_proxy`: the timing proxy around the release side's ledger (per op);
- `histogram`: the small labelled histograms those two fill;
- `web`: the per-process registry, the Faust pages `/metrics` and `/health`;
- `exporter`: the aiohttp server of `dpstream exporter`.

Metric names are a contract (dashboards, alert rules and runbooks depend on them): add, never
rename; prefix `dpstream_`, base units, counters end in `_total`. Every metric has a class
(`classes`): data-independent (a function of the topology, the clock, operator actions and the
releases as of their P(w): budget and breaker state counting only charges whose P(w) has passed,
the schedule, the released values), served to any dashboard; or curator-only (events and dead
letters by outcome, capped and clamped counts, release latency and lag, pending and parked
windows, ledger call durations; whole-source totals only), served only with `--curator-metrics`.
The releases topic is public; everything else is curator-side, and still carries no raw value,
no true aggregate, no unit id and no key taken from the data: labels are topology names (scope,
metric, source), fixed vocabularies (outcome, reason, op, state, currency) and versions. Submodules are
imported where used, so importing this package stays cheap.
"""
