"""taskiq with taskiq-redis for the peer benchmarks; runs in bench/.peers-venv/taskiq."""

from __future__ import annotations

import asyncio
import os
import time
from types import ModuleType
from typing import Any

from taskiq_redis import RedisStreamBroker

from bench import record
from bench.peers.iojob import around_trip

URL = os.environ.get(record.URL_ENV, "redis://127.0.0.1:6379/6")
rec = record.recorder()

# consumer_id "0": a group created by the first worker also sees jobs enqueued before it
broker = RedisStreamBroker(URL, queue_name="bench", consumer_id="0")


@broker.task(task_name="noop")
async def noop() -> None:
    t0 = time.time()
    rec.start_thread()
    rec.job(t0, time.time())


@broker.task(task_name="lat")
async def lat(intended: float, sent: float) -> None:
    t0 = time.time()
    rec.start_thread()
    rec.sample(intended, sent, t0, time.time())


@broker.task(task_name="io")
async def io() -> None:
    t0 = time.time()
    rec.start_thread()
    await around_trip()
    rec.job(t0, time.time())


def enqueue_noop(n: int, task: str = "noop") -> None:
    fn = io if task == "io" else noop

    async def main() -> None:
        await broker.startup()
        for i in range(0, n, 100):
            await asyncio.gather(*(fn.kiq() for _ in range(min(100, n - i))))
        await broker.shutdown()

    asyncio.run(main())


def enqueue_lat(intended: float, sent: float) -> None:
    async def main() -> None:
        await broker.startup()
        await lat.kiq(intended, sent)
        await broker.shutdown()

    asyncio.run(main())


def run_load(loadgen: ModuleType, rate: float, duration_s: float) -> Any:
    async def main() -> Any:
        await broker.startup()

        async def send(intended: list[float], sent_at: float) -> None:
            for t in intended:
                await lat.kiq(t, sent_at)

        try:
            return await loadgen.aopen_loop(send, rate, duration_s)
        finally:
            await broker.shutdown()

    return asyncio.run(main())
