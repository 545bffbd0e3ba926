"""The floor in ``bench peers``' latency rotation: a bare ``RPUSH`` -> ``BLPOP``.

The producer ``RPUSH``es each job's intended and actual send times (two packed
float64s), one call per job from the same paced synchronous loop as the sync peers
(``loadgen.open_loop``); each worker process waits in ``BLPOP`` on a plain redis-py
client and records the job (``bench.record``) the moment the reply is read. No script,
lease, ack, decoding or dispatch: what is left is the round trip and the two wake-ups a
job start needs on this machine, the least any Redis list queue can do. It runs in the
harness's own interpreter (no virtualenv of its own) and has no drain.

``python -m bench.peers.floor_app worker`` (one process; ``bench.peers.multi`` runs N).
"""

from __future__ import annotations

import os
import struct
import sys
import time
from types import ModuleType
from typing import Any

import redis

from bench import record

URL = os.environ.get(record.URL_ENV, "redis://127.0.0.1:6379/8")
KEY = "bench:floor"
rec = record.recorder()


def work() -> None:
    r = redis.Redis.from_url(URL)
    rec.start_thread()
    while True:
        # a bounded wait: redis-py reads with a 5 s socket timeout by default, which an
        # idle BLPOP without a timeout would run into
        reply = r.blpop([KEY], timeout=1)
        got = time.time()
        if reply is None:
            continue
        intended, sent = struct.unpack("<dd", bytes(reply[1]))  # type: ignore[arg-type]
        rec.sample(intended, sent, got, got)


def enqueue_noop(n: int, task: str = "noop") -> None:
    raise NotImplementedError("the floor has no drain")


def enqueue_lat(intended: float, sent: float) -> None:
    redis.Redis.from_url(URL).rpush(KEY, struct.pack("<dd", intended, sent))


def run_load(loadgen: ModuleType, rate: float, duration_s: float) -> Any:
    r = redis.Redis.from_url(URL)

    def send(intended: list[float], sent_at: float) -> None:
        for t in intended:
            r.rpush(KEY, struct.pack("<dd", t, sent_at))

    return loadgen.open_loop(send, rate, duration_s)


if __name__ == "__main__":
    if sys.argv[1:] != ["worker"]:
        print("usage: python -m bench.peers.floor_app worker", file=sys.stderr)
        sys.exit(2)
    work()
