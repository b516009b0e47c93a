"""Noise for every published value: OpenDP mechanisms and error bars.

Sampling is runtime (here); what a release costs is arithmetic (`topology.accounting`). The
empirical audit of these mechanisms is `dpstream.workers.audit`.
"""

from dpstream.workers.noise.mechanisms import TOP_K_SELECTION_SHARE, ReleaseMechanism, build_release_mechanism
from dpstream.workers.noise.release import NoisyRelease

__all__ = ["build_release_mechanism", "NoisyRelease", "ReleaseMechanism", "TOP_K_SELECTION_SHARE"]
