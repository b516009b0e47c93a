"""The period report card (`dpstream budget report`): exact re-accounting, utility, fairness and
allocation advice of one budget period, built from the ledger's audit stream and the stored
release records only (never from raw data or true aggregates).

    period = await collect_period(ledger, topology, "web-daily", "2026-11-30")
    report = build_report(period)          # a JSON-able dict, `report_version: 1`

Submodules are imported by name (`dpstream.workers.report.build` etc.): importing the package
pulls in neither OpenDP, dp-accounting nor matplotlib.
"""
