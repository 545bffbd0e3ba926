"""RQ for the peer benchmarks; runs in bench/.peers-venv/rq."""

from __future__ import annotations

import os
import time
from types import ModuleType
from typing import Any

from redis import Redis
from rq import Queue

from bench import record
from bench.peers.iojob import round_trip

URL = os.environ.get(record.URL_ENV, "redis://127.0.0.1:6379/2")
rec = record.recorder()


def noop() -> None:
    t0 = time.time()
    rec.start_thread()
    rec.job(t0, time.time())


def lat(intended: float, sent: float) -> None:
    t0 = time.time()
    rec.start_thread()
    rec.sample(intended, sent, t0, time.time())


def _queue() -> Queue:
    return Queue("bench", connection=Redis.from_url(URL))


def io() -> None:
    t0 = time.time()
    rec.start_thread()
    round_trip()
    rec.job(t0, time.time())


def enqueue_noop(n: int, task: str = "noop") -> None:
    fn = io if task == "io" else noop
    q = _queue()
    for i in range(0, n, 1000):
        batch = [Queue.prepare_data(fn, result_ttl=0) for _ in range(min(1000, n - i))]
        with q.connection.pipeline() as pipe:
            q.enqueue_many(batch, pipeline=pipe)
            pipe.execute()


def enqueue_lat(intended: float, sent: float) -> None:
    _queue().enqueue(lat, intended, sent, result_ttl=0)


def run_load(loadgen: ModuleType, rate: float, duration_s: float) -> Any:
    q = _queue()

    def send(intended: list[float], sent_at: float) -> None:
        for t in intended:
            q.enqueue(lat, t, sent_at, result_ttl=0)

    return loadgen.open_loop(send, rate, duration_s)
