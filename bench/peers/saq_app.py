"""saq for the peer benchmarks; runs in bench/.peers-venv/saq."""

from __future__ import annotations

import asyncio
import os
import time
from types import ModuleType
from typing import Any

from saq import Queue

from bench import record
from bench.peers.iojob import around_trip

URL = os.environ.get(record.URL_ENV, "redis://127.0.0.1:6379/5")
rec = record.recorder()

queue = Queue.from_url(URL, name="bench")


async def noop(ctx: Any) -> None:
    t0 = time.time()
    rec.start_thread()
    rec.job(t0, time.time())


async def lat(ctx: Any, *, intended: float, sent: float) -> None:
    t0 = time.time()
    rec.start_thread()
    rec.sample(intended, sent, t0, time.time())


async def io(ctx: Any) -> None:
    t0 = time.time()
    rec.start_thread()
    await around_trip()
    rec.job(t0, time.time())


# concurrency: saq's default (10); each concurrent slot holds a blocking dequeue on its own
# connection, and 100 exhausts redis-py's default asyncio pool ("Too many connections")
settings = {"queue": queue, "functions": [noop, lat, io], "concurrency": 10}


def enqueue_noop(n: int, task: str = "noop") -> None:
    async def main() -> None:
        q = Queue.from_url(URL, name="bench")
        await q.connect()
        for i in range(0, n, 100):
            await asyncio.gather(*(q.enqueue(task) for _ in range(min(100, n - i))))
        await q.disconnect()

    asyncio.run(main())


def enqueue_lat(intended: float, sent: float) -> None:
    async def main() -> None:
        q = Queue.from_url(URL, name="bench")
        await q.connect()
        await q.enqueue("lat", intended=intended, sent=sent)
        await q.disconnect()

    asyncio.run(main())


def run_load(loadgen: ModuleType, rate: float, duration_s: float) -> Any:
    async def main() -> Any:
        q = Queue.from_url(URL, name="bench")
        await q.connect()

        async def send(intended: list[float], sent_at: float) -> None:
            for t in intended:
                await q.enqueue("lat", intended=t, sent=sent_at)

        try:
            return await loadgen.aopen_loop(send, rate, duration_s)
        finally:
            await q.disconnect()

    return asyncio.run(main())
