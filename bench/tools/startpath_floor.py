"""The floor of ``python -m bench.tools.startpath --floor``: the least any Redis list queue can
do to start a job, measured the same way as batchq's start.

A producer ``RPUSH``es its clock (taken just before the call) on the same open-loop
schedule as ``startpath_app`` (``loadgen.aopen_loop``, or ``open_loop`` with ``sync``),
one call per job; a worker process on uvloop (as ``batchq worker``) waits in ``BLPOP``
and notes, for each value, the time its reply came. One command, no script, no lease,
no decoding, no dispatch: what is left is the round trip and the two wake-ups a job
start needs on this machine (the server's, then the worker's). Rows go to
``<ns>:rows`` a hundred at a time, off the measured path, in ``startpath_app``'s
format (``before got start``; here ``got`` and ``start`` are the same instant).

``python -m bench.tools.startpath_floor worker NS`` and
``python -m bench.tools.startpath_floor produce NS RATE DURATION [sync]`` (``BATCHQ_REDIS_URL``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import redis
import redis.asyncio

STOP = b"stop"
"""The producer's last value: the worker writes its remaining rows and exits."""


async def _work(url: str, ns: str) -> None:
    r = redis.asyncio.Redis.from_url(url)
    rows: list[str] = []
    writes: set[asyncio.Future[Any]] = set()
    await r.ping()
    await r.set(f"{ns}:ready", 1)
    while True:
        # a bounded wait: redis-py reads with a 5 s socket timeout by default, which an
        # idle BLPOP without a timeout would run into
        reply = await r.blpop([f"{ns}:jobs"], timeout=1)
        got = time.time()
        if reply is None:
            continue
        value = reply[1]
        if value == STOP:
            break
        rows.append(f"{value.decode() if isinstance(value, bytes) else value} {got} {got}")
        if len(rows) >= 100:
            w = asyncio.ensure_future(r.rpush(f"{ns}:rows", *rows))
            rows = []
            writes.add(w)
            w.add_done_callback(writes.discard)
    await asyncio.gather(*writes)
    if rows:
        await r.rpush(f"{ns}:rows", *rows)
    await r.aclose()


async def _produce(url: str, ns: str, rate: float, duration_s: float) -> list[float]:
    from batchq.load.schedule import aopen_loop

    r = redis.asyncio.Redis.from_url(url)
    key = f"{ns}:jobs"
    await r.rpush(key, repr(time.time()))  # warm: the connection, the worker's BLPOP
    await asyncio.sleep(0.5)
    calls: list[float] = []

    async def send(intended: list[float], sent_at: float) -> None:
        for _ in intended:  # one call each, even for jobs that fell due together
            t = time.time()
            await r.rpush(key, repr(t))
            calls.append(time.time() - t)

    await aopen_loop(send, rate, duration_s)
    await r.rpush(key, STOP)
    await r.aclose()
    return calls


def _produce_sync(url: str, ns: str, rate: float, duration_s: float) -> list[float]:
    from batchq.load.schedule import open_loop

    r = redis.Redis.from_url(url)
    key = f"{ns}:jobs"
    r.rpush(key, repr(time.time()))
    time.sleep(0.5)
    calls: list[float] = []

    def send(intended: list[float], sent_at: float) -> None:
        for _ in intended:
            t = time.time()
            r.rpush(key, repr(t))
            calls.append(time.time() - t)

    open_loop(send, rate, duration_s)
    r.rpush(key, STOP)
    r.close()
    return calls


def main(argv: list[str]) -> int:
    url = os.environ["BATCHQ_REDIS_URL"]
    if argv[0] == "worker":
        import uvloop

        uvloop.run(_work(url, argv[1]))
        return 0
    ns, rate, duration_s = argv[1], float(argv[2]), float(argv[3])
    calls = (_produce_sync(url, ns, rate, duration_s) if argv[4:] == ["sync"]
             else asyncio.run(_produce(url, ns, rate, duration_s)))
    print(json.dumps(calls))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
