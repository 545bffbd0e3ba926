"""The app of ``python -m bench shards``: one no-op task and nothing else (no timing
reports: the scenario reads Redis's own counters), built from ``BATCHQ_REDIS_URL`` (a
cluster URL) and ``BENCH_NAMESPACE``."""

from __future__ import annotations

import os
from typing import Any

import batchq

app = batchq.App(os.environ.get("BATCHQ_REDIS_URL"),
                 namespace=os.environ.get("BENCH_NAMESPACE", "bench"))


@app.task(queue="hot")
async def noop(*args: Any) -> None:
    """A no-op job."""
