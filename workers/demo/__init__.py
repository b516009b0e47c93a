"""`dpstream demo`: the main job on a local stack — a worker, a synthetic feed and a live table of releases."""

from dpstream.workers.demo.run import DemoOptions, run_demo

__all__ = ["DemoOptions", "run_demo"]
