"""Debounce and replace: a keyed enqueue with ``on_conflict="replace"`` gives a waiting
job the latest arguments (same id, same place), ``"debounce"`` also pushes its start to
``delay_s`` after the latest call; racing producers (and a worker popping meanwhile)
still leave one job per key, each run once."""

from __future__ import annotations

import asyncio
import collections
import multiprocessing
import threading
import time

import msgpack
import pytest
import redis
from fixtures.campaigns import *  # noqa: F403
from fixtures.campaigns import make_app
from helpers import wait_until

import batchq

pytestmark = pytest.mark.integration


def _ran(r: redis.Redis, ns: str) -> list[str]:
    return [x.decode() for x in r.lrange(f"{ns}:ran", 0, -1)]


def _args_of(entry: bytes) -> list[object]:
    return msgpack.unpackb(entry.split(b":", 4)[4])[1]  # type: ignore[no-any-return]


def test_replace_gives_a_ready_job_the_latest_args_in_its_place(app, drain, redis_client,
                                                                namespace):
    send = app.tasks["send"]
    before = send.enqueue("x0")
    first = send.options(key="k", on_conflict="replace").enqueue("v1")
    after = send.enqueue("x1")
    assert send.options(key="k", on_conflict="replace").enqueue("v2") == first
    assert send.options(key="k", on_conflict="replace").enqueue("v3") == first
    ready = redis_client.lrange(app.keys("a").ready_for(0), 0, -1)
    assert [e.split(b":", 4)[3].decode() for e in ready] == [before, first, after]
    assert _args_of(ready[1]) == ["v3"]
    assert app.queue("a").stats().ready == 3
    drain("a")
    assert sorted(_ran(redis_client, namespace)) == ["v3", "x0", "x1"]
    # settled, and a replaced key is held only while its job waits or runs: free again
    assert send.options(key="k", on_conflict="replace").enqueue("v4") != first


def test_keep_is_still_the_default(app, redis_client):
    send = app.tasks["send"]
    first = send.options(key="k").enqueue("v1")
    assert send.options(key="k").enqueue("v2") == first
    assert send.options(key="k", on_conflict="keep").enqueue("v3") == first
    ready = redis_client.lrange(app.keys("a").ready_for(0), 0, -1)
    assert [_args_of(e) for e in ready] == [["v1"]]


def test_replace_a_delayed_job_keeps_its_due_time(app, redis_client):
    send = app.tasks["send"]
    k = app.keys("a")
    first = send.options(key="d", delay_s=60, on_conflict="replace").enqueue("v1")
    (_e1, due1), = redis_client.zrange(k.delayed, 0, -1, withscores=True)
    assert send.options(key="d", on_conflict="replace").enqueue("v2") == first
    (e2, due2), = redis_client.zrange(k.delayed, 0, -1, withscores=True)
    assert (_args_of(e2), due2) == (["v2"], due1)
    assert redis_client.hget(k.pending, first) == e2  # cancel / status find the new entry
    assert app.cancel(first)
    assert redis_client.zcard(k.delayed) == 0


def test_debounce_runs_once_after_the_calls_stop(app, drain, redis_client, namespace):
    send = app.tasks["send"]
    k = app.keys("a")
    deb = send.options(key="user:7", delay_s=0.6, on_conflict="debounce")
    first = deb.enqueue("c1")
    dues = [redis_client.zrange(k.delayed, 0, -1, withscores=True)[0][1]]
    for i in range(2, 5):
        time.sleep(0.05)
        assert deb.enqueue(f"c{i}") == first
        dues.append(redis_client.zrange(k.delayed, 0, -1, withscores=True)[0][1])
    assert dues == sorted(dues) and dues[-1] > dues[0]  # each call pushed the start
    assert redis_client.zcard(k.delayed) == 1
    wait_until(lambda: redis_client.zrangebyscore(k.delayed, "-inf", time.time() * 1000
                                                  + 5), timeout_s=10)
    time.sleep(0.05)
    drain("a")
    assert _ran(redis_client, namespace) == ["c4"]


def test_bad_on_conflict_is_refused_naming_it(app):
    send = app.tasks["send"]
    with pytest.raises(ValueError, match="on_conflict"):
        send.options(key="k", on_conflict="newest")
    with pytest.raises(ValueError, match="needs a dedup key"):
        send.options(on_conflict="replace").enqueue(1)
    with pytest.raises(ValueError, match="needs delay_s"):
        send.options(key="k", on_conflict="debounce").enqueue(1)
    with pytest.raises(ValueError, match="timeout_s"):
        send.options(timeout_s=0)
    assert app.queue("a").stats().ready == 0


def _race(url: str, ns: str, mode: str, n: int, keys: int,
          start: multiprocessing.synchronize.Event,
          out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    app = make_app(url, ns)
    start.wait()
    me = multiprocessing.current_process().name
    opts = {"delay_s": 0.05} if mode == "debounce" else {}
    ids = []
    for i in range(n):
        key = f"k{i % keys}"
        t = app.tasks["send"].options(key=key, on_conflict=mode, **opts)
        ids.append((key, t.enqueue(f"{key}|{me}|{i}")))
    out.put(ids)
    app.close()


@pytest.mark.parametrize("mode", ["replace", "debounce"])
def test_racing_producers_and_a_popping_worker_one_job_per_key(app, redis_url, namespace,
                                                                redis_client, mode):
    """Four producer processes replace the same keys while a worker drains the queue:
    every id they got back ran exactly once, and each run carries one call's args."""
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(redis_url, namespace, mode, 300, 10, start,
                                             out)) for _ in range(4)]
    for p in procs:
        p.start()
    stop = threading.Event()

    def work() -> None:
        s = batchq.WorkerSettings(queues=("a",), install_signal_handlers=False,
                                  metrics=False, concurrency=4)
        w = batchq.Worker(app, s)

        async def main() -> None:
            task = asyncio.create_task(w.run())
            while not stop.is_set():
                await asyncio.sleep(0.05)
            w.request_stop()
            await task

        asyncio.run(main())

    t = threading.Thread(target=work)
    t.start()
    start.set()
    try:
        results = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        q = app.queue("a")
        wait_until(lambda: q.stats().pending == 0, timeout_s=60)
    finally:
        stop.set()
        t.join(60)
    ids_by_key: dict[str, set[str]] = collections.defaultdict(set)
    for r in results:
        for key, jid in r:
            ids_by_key[key].add(jid)
    ran = _ran(redis_client, namespace)
    assert len(ran) == len(set(ran)), "a call's args ran twice"
    runs_by_key = collections.Counter(x.split("|")[0] for x in ran)
    # one run per job: every id handed out ran once, no job ran without an id
    assert runs_by_key == {k: len(v) for k, v in ids_by_key.items()}
    assert sum(runs_by_key.values()) < 1200  # replaced, not one job per call
