"""Synthetic events for a topology's sources: skewed users, realistic fields, malformed events on request.

Only modules under a path containing `synthetic` may use a non-cryptographic RNG
(a published value's noise comes only from OpenDP's samplers).
"""

from __future__ import annotations

from dpstream.workers.synthetic.generator import (
    EventGenerator,
    GeneratorConfig,
    Malformation,
    SyntheticEvent,
    write_jsonl,
)

__all__ = ["EventGenerator", "GeneratorConfig", "Malformation", "SyntheticEvent", "write_jsonl"]
