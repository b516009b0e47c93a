"""Empirical privacy audit: black-box lower bounds on ε for the production noise mechanisms.

It sits above `workers.noise`: it samples the mechanisms the releaser uses and checks them, so
nothing that makes a published value imports it (`dpstream audit-privacy` and the privacy tests do).

- `dpstream.workers.audit.empirical`: the audit itself (`audit`, `standard_cases`, `broken_cases`, `Claim`).
- `dpstream.workers.audit.stats`: the exact small statistics it needs without scipy (binomial tails,
  Clopper–Pearson bounds, χ² p-values).

The modules are named for what they hold (`empirical`, not `audit.audit`), and this package
imports neither, so `stats` can be used without loading OpenDP.
"""
