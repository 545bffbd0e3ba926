"""The worker app of ``python -m bench.startpath``: one latency task whose handler notes,
for its job, when the worker process got the job and when the handler started.

"Got" is when the fetch accepted the entry (``Fetcher.accept``: the hand-off's BLPOP or a
pop reply), taken from a wrapper this module puts around that method; the jobs of one
queue with no-op handlers start in the order they were accepted, so a FIFO of accept
times pairs each with its handler. A diagnostic of this harness, not an API: the worker
is the tree's own ``batchq worker``, unchanged apart from that wrapper.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
from typing import Any

import batchq
from batchq.worker import fetch

QUEUE = "startpath"
_accepted: collections.deque[float] = collections.deque()
_rows: list[str] = []
_writes: set[asyncio.Future[Any]] = set()
_accept = fetch.Fetcher.accept


def _noting_accept(self: fetch.Fetcher, queue: str, entries: list[bytes],
                   *args: Any, **kwargs: Any) -> int:
    now = time.time()
    _accepted.extend(now for _ in entries)
    return _accept(self, queue, entries, *args, **kwargs)


fetch.Fetcher.accept = _noting_accept  # type: ignore[method-assign]

app = batchq.App(os.environ.get("BATCHQ_REDIS_URL"),
                 namespace=os.environ.get("STARTPATH_NS", "startpath"))


@app.task(queue=QUEUE)
async def probe(before_call: float) -> None:
    """``before_call``: the producer's clock just before its ``aenqueue`` (``enqueue``)."""
    started = time.time()
    got = _accepted.popleft() if _accepted else float("nan")
    _rows.append(f"{before_call} {got} {started}")
    if len(_rows) >= 100:
        rows = _rows[:]
        _rows.clear()
        # off the measured path: the next jobs start before this write is on the wire
        w = asyncio.ensure_future(app.async_redis().rpush(f"{app.namespace}:rows", *rows))
        _writes.add(w)
        w.add_done_callback(_writes.discard)


async def _produce(rate: float, duration_s: float) -> list[float]:
    """Enqueue ``probe`` jobs one by one on batchq's open-loop schedule
    (``loadgen.aopen_loop``) at ``rate`` a second; the ``aenqueue`` call times."""
    from batchq.loadgen import aopen_loop

    await probe.aenqueue(time.time())  # warm: connection, scripts, the worker's first pop
    await asyncio.sleep(0.5)
    calls: list[float] = []

    async def send(intended: list[float], sent_at: float) -> None:
        for _ in intended:  # one call each, even for jobs that fell due together
            t = time.time()
            await probe.aenqueue(t)
            calls.append(time.time() - t)

    await aopen_loop(send, rate, duration_s)
    await app.aclose()
    return calls


def _produce_sync(rate: float, duration_s: float) -> list[float]:
    """``_produce`` with ``enqueue`` on the synchronous open loop (``loadgen.open_loop``)."""
    from batchq.loadgen import open_loop

    probe.enqueue(time.time())
    time.sleep(0.5)
    calls: list[float] = []

    def send(intended: list[float], sent_at: float) -> None:
        for _ in intended:
            t = time.time()
            probe.enqueue(t)
            calls.append(time.time() - t)

    open_loop(send, rate, duration_s)
    app.close()
    return calls


if __name__ == "__main__":
    import json
    import sys

    rate, duration_s = float(sys.argv[1]), float(sys.argv[2])
    sync = sys.argv[3:] == ["sync"]
    print(json.dumps(_produce_sync(rate, duration_s) if sync
                     else asyncio.run(_produce(rate, duration_s))))
