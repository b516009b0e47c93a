"""`dpstream verify`: check the invariants of a live deployment from what it left behind.

It reads the releases topic, the dead-letter topic and the ledger (never writes any of them) and
names every violation in one line:

- a release_id published with two different payloads (byte comparison);
- a published release_id without a charge in the ledger (or whose published bytes differ
  from the payload the ledger stored with the charge);
- per budget scope and period: spend that differs from the sum of the audit stream's charges, spend
  above the cap, selection δ above its cap;
- a scheduled window (from the schedule start S to now minus a grace) neither published nor
  recorded by the ledger as refused with a reason;
- a release published during a ledger outage given with `--outage FROM/TO` (unless charged before it);
- optionally (`--compare-to TOPIC`), a released value that differs from another run's release of
  the same window by more than a tolerance.

    report = await verify_deployment(topology, VerifyOptions(bootstrap, redis_url))
    print(render_text(report))           # or render_json(report)

`checks` holds the pure checks (no Kafka, no Redis); `sources` the read-only readers.
"""

from __future__ import annotations

__all__ = ["VerifyOptions", "VerifyReport", "Violation", "render_json", "render_text", "verify_deployment"]

from dpstream.workers.verify.report import VerifyReport, Violation, render_json, render_text
from dpstream.workers.verify.run import VerifyOptions, verify_deployment
