"""arq for the peer benchmarks; runs in bench/.peers-venv/arq."""

from __future__ import annotations

import asyncio
import os
import time
from types import ModuleType
from typing import Any

from arq.connections import RedisSettings, create_pool

from bench import record
from bench.peers.iojob import around_trip

URL = os.environ.get(record.URL_ENV, "redis://127.0.0.1:6379/3")
rec = record.recorder()


async def noop(ctx: dict[str, Any]) -> None:
    t0 = time.time()
    rec.start_thread()
    rec.job(t0, time.time())


async def lat(ctx: dict[str, Any], intended: float, sent: float) -> None:
    t0 = time.time()
    rec.start_thread()
    rec.sample(intended, sent, t0, time.time())


async def io(ctx: dict[str, Any]) -> None:
    t0 = time.time()
    rec.start_thread()
    await around_trip()
    rec.job(t0, time.time())


class WorkerSettings:
    functions = [noop, lat, io]
    redis_settings = RedisSettings.from_dsn(URL)
    max_jobs = 100
    poll_delay = 0.01
    keep_result = 0
    max_tries = 1


def enqueue_noop(n: int, task: str = "noop") -> None:
    async def main() -> None:
        pool = await create_pool(WorkerSettings.redis_settings)
        for i in range(0, n, 100):
            await asyncio.gather(*(pool.enqueue_job(task) for _ in range(min(100, n - i))))
        await pool.aclose()

    asyncio.run(main())


def enqueue_lat(intended: float, sent: float) -> None:
    async def main() -> None:
        pool = await create_pool(WorkerSettings.redis_settings)
        await pool.enqueue_job("lat", intended, sent)
        await pool.aclose()

    asyncio.run(main())


def run_load(loadgen: ModuleType, rate: float, duration_s: float) -> Any:
    async def main() -> Any:
        pool = await create_pool(WorkerSettings.redis_settings)

        async def send(intended: list[float], sent_at: float) -> None:
            for t in intended:
                await pool.enqueue_job("lat", t, sent_at)

        try:
            return await loadgen.aopen_loop(send, rate, duration_s)
        finally:
            await pool.aclose()

    return asyncio.run(main())
