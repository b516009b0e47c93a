"""The declared pipeline and its privacy arithmetic: pure, no I/O beyond reading a topology file.

Privacy model. The privacy unit (`privacy_unit: user_id`) names the person protected: neighbouring
streams differ by all events of one unit within one budget period. `privacy_unit: event` is
allowed only when chosen explicitly and is labelled weaker wherever it shows (`EVENT_LEVEL_LABEL`).
A budget scope (`epsilon`, `delta`, `period`) renews each UTC-aligned period (`periods`); over an
unbounded horizon "ε per unit per day" weakens. Each scope keeps one currency (`accounting`): zCDP
(ρ adds up; the cap is the largest ρ whose (ε, δ) conversion fits the scope) or pure ε. Contribution
bounding happens before aggregation: per unit and window at most `max_keys` keys (L0) and
`max_per_key` events per key (L∞), values clamped to `bounds`; sensitivities come only from these
declared bounds (`sensitivity`). With `max_windows: m` a unit also counts in at most m windows of the
metric per period: at each window's close, in the public close order, the units present whose count
is below m are included and counted, whatever the release does; the others' contributions to that
window are dropped. Which windows a unit counts in depends on its own records only, and each release
is priced at the metric's period share over min(windows per period, m). It is refused on windows that
can straddle a period boundary, so one period's events never move which windows count in the next.
Keys taken from data pass DP partition selection (`selection`); declared keys are always released, zero or not.

Stream rules: apart from the noised values nothing published depends on the data.

1. An event counts in window w iff its own event time lies in w and its own arrival time (the
   broker's append time; `arrival: create_time` opts into the producer's, weaker) is at or before
   C(w) = end(w) + allowed_lateness. No watermark of other events' times decides anything.
2. The release schedule is public: every window from the schedule start S (`start:`, else the
   first start of this topology version, recorded once in the ledger) is released once C(w) has
   passed, empty or not, and published no earlier than P(w) = C(w) + `publish_delay`, stamped P(w).
3. The true aggregate of w is a function of the records appended up to C(w) only: not of partition
   assignment, batch cuts, restarts or merge order; every source partition reports every window.

Bounding is global per unit: a `keyed_by_unit` source must put each record in its key's partition
under the declared `partitioner` (murmur2 or crc32), or a repartition hop keys it. Bounding is
order-independent: L0 keeps keys by a keyed hash of (unit, window, key), L∞ keeps the smallest
(source append time, partition, offset) contributions. The budget plan (`plan`, `allocation`) divides each
scope's cap − reserve over its metrics by weight; the ledger re-divides what is left at every
release (adaptive allocation), counting only windows from S.
"""
