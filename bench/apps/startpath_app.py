"""The worker app of ``python -m bench.tools.startpath``: one latency task whose handler notes,
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
    from batchq.load.schedule import aopen_loop

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
    from batchq.load.schedule import open_loop

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


def _script_usec() -> int:
    """The server's time in ``EVALSHA`` so far (µs; ``INFO commandstats``)."""
    stats: dict[str, dict[str, int]] = app.redis.info("commandstats")  # type: ignore[assignment]
    return sum(stats.get(f"cmdstat_{c}", {}).get("usec", 0) for c in ("evalsha", "fcall"))


def call_costs(api: str, n: int, idle_n: int, sleep_ms: float) -> dict[str, float]:
    """``python -m bench.tools.callcost``: µs per ``enqueue`` (``aenqueue``) call, nobody
    consuming: ``n`` calls back to back (the mean, and the server's script time per
    call), then ``idle_n`` calls each made after ``sleep_ms`` of sleep (the median)."""
    idle: list[float] = []
    if api == "sync":
        for _ in range(100):  # warm: connection, scripts, sequence numbers
            probe.enqueue(0.0)
        usec = _script_usec()
        t0 = time.perf_counter()
        for _ in range(n):
            probe.enqueue(0.0)
        tight = time.perf_counter() - t0
        usec = _script_usec() - usec
        for _ in range(idle_n):
            time.sleep(sleep_ms / 1000)
            t = time.perf_counter()
            probe.enqueue(0.0)
            idle.append(time.perf_counter() - t)
        app.close()
    else:
        async def run() -> tuple[float, int]:
            for _ in range(100):
                await probe.aenqueue(0.0)
            usec = _script_usec()
            t0 = time.perf_counter()
            for _ in range(n):
                await probe.aenqueue(0.0)
            tight = time.perf_counter() - t0
            usec = _script_usec() - usec
            for _ in range(idle_n):
                await asyncio.sleep(sleep_ms / 1000)
                t = time.perf_counter()
                await probe.aenqueue(0.0)
                idle.append(time.perf_counter() - t)
            await app.aclose()
            return tight, usec
        tight, usec = asyncio.run(run())
        app.close()
    idle.sort()
    return {"tight_us": tight / n * 1e6, "idle_us": idle[len(idle) // 2] * 1e6,
            "redis_us": usec / n}


if __name__ == "__main__":
    import json
    import sys

    if sys.argv[1] == "calls":
        api, n, idle_n, sleep_ms = sys.argv[2], *map(int, sys.argv[3:5]), float(sys.argv[5])
        print(json.dumps(call_costs(api, n, idle_n, sleep_ms)))
        sys.exit(0)
    rate, duration_s = float(sys.argv[1]), float(sys.argv[2])
    sync = sys.argv[3:] == ["sync"]
    print(json.dumps(_produce_sync(rate, duration_s) if sync
                     else asyncio.run(_produce(rate, duration_s))))
