"""dramatiq (Redis broker) for the peer benchmarks; runs in bench/.peers-venv/dramatiq."""

from __future__ import annotations

import os
import time
from types import ModuleType
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench import record
from bench.peers.iojob import round_trip

URL = os.environ.get(record.URL_ENV, "redis://127.0.0.1:6379/4")
rec = record.recorder()

broker = RedisBroker(url=URL)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="bench", max_retries=0)
def noop() -> None:
    t0 = time.time()
    rec.start_thread()
    rec.job(t0, time.time())


@dramatiq.actor(queue_name="bench", max_retries=0)
def lat(intended: float, sent: float) -> None:
    t0 = time.time()
    rec.start_thread()
    rec.sample(intended, sent, t0, time.time())


@dramatiq.actor(queue_name="bench", max_retries=0)
def io() -> None:
    t0 = time.time()
    rec.start_thread()
    round_trip()
    rec.job(t0, time.time())


def enqueue_noop(n: int, task: str = "noop") -> None:
    fn = io if task == "io" else noop
    for _ in range(n):
        fn.send()


def enqueue_lat(intended: float, sent: float) -> None:
    lat.send(intended, sent)


def run_load(loadgen: ModuleType, rate: float, duration_s: float) -> Any:
    def send(intended: list[float], sent_at: float) -> None:
        for t in intended:
            lat.send(t, sent_at)

    return loadgen.open_loop(send, rate, duration_s)
