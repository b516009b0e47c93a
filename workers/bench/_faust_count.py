"""The naive baseline of `bench pipeline`: a plain per-event Faust agent counting per window into a Table.

Run as `python -m workers.bench._faust_count BOOTSTRAP TOPIC WINDOW_S PROGRESS_FILE`; it writes the
number of events counted to PROGRESS_FILE about every 0.5 s.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import uuid

import faust


def main(bootstrap: str, topic: str, window_s: int, progress: str) -> None:
    """Start the app and run until terminated."""
    app = faust.App(
        f"bench-naive-{uuid.uuid4().hex[:8]}",
        broker=f"kafka://{bootstrap}",
        store="memory://",
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        topic_partitions=4,
        datadir=tempfile.mkdtemp(prefix="bench-naive-"),
    )
    source = app.topic(topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
    counts = app.Table("counts", default=int, partitions=4)
    seen = {"n": 0, "t": 0.0}

    @app.agent(source)
    async def count(stream: faust.StreamT) -> None:
        async for value in stream:
            try:
                doc = json.loads(value)
                window = int(float(doc["ts"]) // window_s) * window_s
            except (ValueError, KeyError, TypeError):
                continue
            counts[f"{window}|{doc.get('page')}"] += 1
            seen["n"] += 1
            now = time.monotonic()
            if now - seen["t"] > 0.5:
                seen["t"] = now
                with open(progress, "w") as out:
                    out.write(f"{seen['n']} {time.time()}\n")

    worker = faust.Worker(app, loglevel="ERROR", quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
