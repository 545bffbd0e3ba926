"""Celery (Redis broker) for the peer benchmarks; runs in bench/.peers-venv/celery."""

from __future__ import annotations

import os
import time
from types import ModuleType
from typing import Any

from celery import Celery

from bench import record
from bench.peers.iojob import round_trip

URL = os.environ.get(record.URL_ENV, "redis://127.0.0.1:6379/1")
rec = record.recorder()

app = Celery("bench", broker=URL)
app.conf.update(
    task_ignore_result=True,
    task_default_queue="bench",
    worker_prefetch_multiplier=64,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="noop")
def noop() -> None:
    t0 = time.time()
    rec.start_thread()
    rec.job(t0, time.time())


@app.task(name="lat")
def lat(intended: float, sent: float) -> None:
    t0 = time.time()
    rec.start_thread()
    rec.sample(intended, sent, t0, time.time())


@app.task(name="io")
def io() -> None:
    t0 = time.time()
    rec.start_thread()
    round_trip()
    rec.job(t0, time.time())


def enqueue_noop(n: int, task: str = "noop") -> None:
    fn = io if task == "io" else noop
    with app.producer_or_acquire() as producer:
        for _ in range(n):
            fn.apply_async(producer=producer)


def enqueue_lat(intended: float, sent: float) -> None:
    lat.apply_async((intended, sent))


def run_load(loadgen: ModuleType, rate: float, duration_s: float) -> Any:
    with app.producer_or_acquire() as producer:
        def send(intended: list[float], sent_at: float) -> None:
            for t in intended:
                lat.apply_async((t, sent_at), producer=producer)

        return loadgen.open_loop(send, rate, duration_s)
