"""Moved to `dpstream.workers.audit.empirical`; this alias only keeps old imports working.

The empirical audit is not part of the noise a release draws, so it left `workers.noise`. Import it
from `dpstream.workers.audit.empirical`; remove this module once tests/privacy/test_audit.py does.
"""

from dpstream.workers.audit.empirical import *  # noqa: F403 - a re-export of the moved module, nothing else
from dpstream.workers.audit.empirical import __all__  # noqa: F401 - the same public names
