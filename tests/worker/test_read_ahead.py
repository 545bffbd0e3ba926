"""Read-ahead: a worker serving one queue with a backlog keeps two pops on the
wire, so the server pops the next batch while the worker runs the last one. Jobs those
pops lease are never stranded: a stop gives them back like any job not started."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import pytest
import redis
from fixtures.basic import *  # noqa: F403
from fixtures.runs import pending_keys, wait_exit
from helpers import forget_scripts, function_libraries, wait_until

import batchq
from batchq.store import codec
from batchq.store.scripts.replies import decode_pop_reply
from batchq.worker import fetch, fetch_size
from batchq.worker.selection import Selector

pytestmark = pytest.mark.integration


def _succeeded(r: redis.Redis, app: batchq.App, queue: str) -> int:
    return int(r.hget(app.keys(queue).stats, "succeeded") or 0)


def _tally_worker(app: batchq.App, queue: str, n: int, *, burst: bool
                  ) -> tuple[batchq.Worker, list[int]]:
    """``n`` jobs queued whose handler notes its number, and an in-process worker of
    ``queue`` (no metrics, no signal handlers)."""
    seen: list[int] = []

    @app.task(queue=queue, name="tally")
    async def tally(i: int) -> None:
        seen.append(i)

    tally.enqueue_many(range(n))
    s = batchq.WorkerSettings(queues=(queue,), burst=burst, metrics=False,
                              install_signal_handlers=False)
    return batchq.Worker(app, s), seen


def _record_plans(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Each fetch round's plan (the jobs it asks each queue or shard for), as planned."""
    plans: list[list[int]] = []
    plan = Selector.plan

    def recorded(self: Selector, free: int, among: list[int] | None = None) -> Any:
        out = plan(self, free, among)
        plans.append([want for _, want in out])
        return out

    monkeypatch.setattr(Selector, "plan", recorded)
    return plans


def test_a_backlog_keeps_two_pops_on_the_wire_and_runs_every_job_once(
        app, queue_name, redis_client):
    n = 6000
    w, seen = _tally_worker(app, queue_name, n, burst=True)
    s = w.settings
    f = w.fetcher
    call = f._call
    wire, most, full = 0, 0, 0
    wants: list[int] = []
    sizes: list[int] = []  # the pop size the fetcher held when it sent each pop

    async def counted(k: Any, want: int, lease_ms: int) -> Any:
        nonlocal wire, most, full
        wire += 1
        most = max(most, wire)
        wants.append(want)
        sizes.append(f.size.batch)
        try:
            res = await call(k, want, lease_ms)
            got = len(decode_pop_reply(res).jobs)
            full += got * (got == want)
            return res
        finally:
            wire -= 1

    f._call = counted  # type: ignore[method-assign]
    assert asyncio.run(w.run()) == 0
    # every job once, and in the order queued: replies read out of order (two
    # connections) still start their jobs in the order popped
    assert seen == list(range(n))
    big = fetch_size.BEHIND_BATCH * s.fetch_batch
    assert full >= n - 2 * big, f"only {full} jobs came in full pops"
    assert most == 2, f"at most {most} pops were on the wire at once"
    # the first pop asks for a batch; behind (the backlog waited), pops grow to
    # BEHIND_BATCH batches and stay grown while the backlog lasts: only the short pops
    # at the end (the queue ran dry) bring the size back. A pop may still ask less than
    # that size: the prefetch cap leaves less room when handlers run slower (a loaded
    # box), so the count of pops asking the full size is not fixed.
    assert wants[0] == s.fetch_batch and max(wants) == big, (wants, sizes)
    grown = sizes.index(big)
    back = sizes.index(s.fetch_batch, grown) if s.fetch_batch in sizes[grown:] else len(sizes)
    assert set(sizes[grown:back]) == {big}, (wants, sizes)
    assert len(sizes) - back <= 2, f"the size fell back before the backlog ran dry: {sizes}"
    assert sum(w for w in wants if w > s.fetch_batch) >= n // 2, (wants, sizes)
    assert f.size.batch == s.fetch_batch
    assert pending_keys(redis_client, app, queue_name) == {
        "ready": 0, "delayed": 0, "reserved": 0, "inflight": 0}


def test_a_stop_gives_back_the_jobs_of_pops_sent_ahead(app, queue_name, start_worker,
                                                      redis_client):
    n = 200_000
    app.tasks["quiet"].options(queue=queue_name).enqueue_many(range(n))
    worker = start_worker(queue_name)
    wait_until(lambda: _succeeded(redis_client, app, queue_name) > 20_000, timeout_s=30,
               message="the worker did not drain")
    worker.send_signal(signal.SIGTERM)  # mid-drain: pops are on the wire
    assert wait_exit(worker, 30) == 0, worker.read_log()
    left = pending_keys(redis_client, app, queue_name)
    done = _succeeded(redis_client, app, queue_name)
    assert done < n, "the drain ended before the stop: nothing was tested"
    # nothing leased is left behind: every job ran once or is ready again
    assert (left["reserved"], left["inflight"]) == (0, 0), left
    assert left["ready"] + done == n, (left, done)


def test_a_stop_waits_for_a_slow_reply_to_a_pop_sent_ahead(app, queue_name, redis_client):
    """The stop comes while a pop sent ahead is on the wire and its reply is slow: the
    fetch loop waits for it, so its jobs are taken in and given back by the drain, not
    left leased until their leases expire (and then counted as a crash's neighbours)."""
    n = 3000
    w, seen = _tally_worker(app, queue_name, n, burst=False)
    f = w.fetcher
    call = f._call
    slowed: list[int] = []

    async def slow_ahead(k: Any, want: int, lease_ms: int) -> Any:
        ahead = asyncio.current_task() in f.ahead.rounds
        stop = ahead and not slowed and len(seen) >= 500
        if stop:
            w.request_stop()  # sent ahead, and now the worker stops
        res = await call(k, want, lease_ms)
        if stop:
            slowed.append(len(decode_pop_reply(res).jobs))
            await asyncio.sleep(0.3)  # the reply is late
        return res

    f._call = slow_ahead  # type: ignore[method-assign]
    assert asyncio.run(w.run()) == 0
    assert slowed and slowed[0] > 0, "no pop sent ahead brought jobs when the stop came"
    left = pending_keys(redis_client, app, queue_name)
    assert (left["reserved"], left["inflight"]) == (0, 0), left
    assert left["ready"] + len(seen) == n and len(set(seen)) == len(seen), (left, len(seen))


def test_a_worker_of_several_queues_reads_ahead_too(app, queue_name, redis_client,
                                                    monkeypatch: pytest.MonkeyPatch):
    """Rounds over several queues (one pipeline each) are read ahead like one queue's
    pops; each queue's jobs still start in the order queued."""
    n = 3000
    qa, qb = f"{queue_name}-a", f"{queue_name}-b"
    seen: dict[str, list[int]] = {qa: [], qb: []}

    @app.task(queue=qa, name="tally2")
    async def tally2(q: str, i: int) -> None:
        seen[q].append(i)

    for q in (qa, qb):
        tally2.options(queue=q).enqueue_many([(q, i) for i in range(n)])
    wire, most = 0, 0
    run = fetch.arun_pipeline

    async def counted(pipe: Any, client: Any) -> Any:
        nonlocal wire, most
        wire += 1
        most = max(most, wire)
        try:
            return await run(pipe, client)
        finally:
            wire -= 1

    monkeypatch.setattr(fetch, "arun_pipeline", counted)
    plans = _record_plans(monkeypatch)
    s = batchq.WorkerSettings(queues=(qa, qb), burst=True, metrics=False,
                              install_signal_handlers=False)
    w = batchq.Worker(app, s)
    assert asyncio.run(w.run()) == 0
    assert seen == {qa: list(range(n)), qb: list(range(n))}
    assert most == 2, f"at most {most} rounds were on the wire at once"
    # rounds over several queues do not grow (a sharded queue's do: below), so rotation
    # interleaves the queues at fetch_batch's grain
    assert max(x for p in plans for x in p) <= s.fetch_batch, plans
    assert w.fetcher.size.batch == w.fetcher.selector.fetch_batch == s.fetch_batch
    for q in (qa, qb):
        assert pending_keys(redis_client, app, q) == {
            "ready": 0, "delayed": 0, "reserved": 0, "inflight": 0}


def test_a_sharded_queue_behind_pops_bigger_rounds(app, queue_name,
                                                  monkeypatch: pytest.MonkeyPatch):
    """Behind, a round over one queue's shards plans with BEHIND_BATCH x fetch_batch:
    its share goes to fewer shards, more from each; the short rounds at the end bring
    the size back, and every job runs once."""
    n = 8000
    seen: list[int] = []

    @app.task(queue=queue_name, name="tally_sharded", shards=4)
    async def tally_sharded(i: int) -> None:
        seen.append(i)

    tally_sharded.enqueue_many(range(n))
    plans = _record_plans(monkeypatch)
    s = batchq.WorkerSettings(queues=(queue_name,), burst=True, metrics=False,
                              install_signal_handlers=False)
    w = batchq.Worker(app, s)
    assert asyncio.run(w.run()) == 0
    assert sorted(seen) == list(range(n))
    big = fetch_size.BEHIND_BATCH * s.fetch_batch
    wants = [x for p in plans for x in p]
    assert max(plans[0]) <= s.fetch_batch < max(wants) <= big, plans
    # most jobs were asked for in pops bigger than fetch_batch (the plans, not the replies)
    assert sum(x for x in wants if x > s.fetch_batch) >= n // 2, plans
    # in whole pops: a grown round asks each shard for the full size (one less where a
    # short shard gets its probe of one job), not the room split three ways
    grown = [x for x in wants if x > s.fetch_batch]
    assert sum(x >= big - 1 for x in grown) >= 0.9 * len(grown), plans
    assert w.fetcher.size.batch == w.fetcher.selector.fetch_batch == s.fetch_batch
    st = app.queue(queue_name).stats()
    assert (st.ready, st.pending) == (0, 0), st
    assert len(app.queue(queue_name).shards()) == 4


def test_only_a_queue_that_is_behind_is_read_ahead() -> None:
    """A full pop whose oldest job had waited READ_AHEAD_BEHIND_MS or more is read
    ahead; one whose jobs are fresh (a worker keeping up with its producers) is not, so
    it does not hold jobs an idle neighbour could start sooner."""
    now = int(time.time() * 1000)

    def reply(*ready_ms: int) -> list[Any]:
        head: list[Any] = [now, -1, -1, 0, 0, 0, 0, 0, [], [], []]
        return head + [codec.header(0, 3) + f"j{i}".encode() + b":"
                       + codec.encode_body("t", [], {}, ms) for i, ms in enumerate(ready_ms)]

    def behind(raw: list[Any]) -> bool:
        return fetch_size.behind(decode_pop_reply(raw))

    late = fetch_size.READ_AHEAD_BEHIND_MS
    assert behind(reply(now - late - 50, now))
    assert not behind(reply(now + 5, now - 1000))  # the first popped is the oldest
    assert not behind(reply())
    assert not behind([*reply(), b"not a job"])


def test_a_worker_loads_the_scripts_of_a_jobs_way_before_its_first_pop(
        app, queue_name, redis_client):
    """With pops on the wire at once, a pop sent again after NOSCRIPT (its script not
    loaded yet) lands behind the pop sent after it, and the later jobs start first: so
    a worker loads its scripts at start, not on first use (an empty burst run pops once
    and acks nothing, yet every script is there)."""
    from batchq.worker.worker import PRELOADED_SCRIPTS

    forget_scripts(redis_client)
    w = batchq.Worker(app, batchq.WorkerSettings(queues=(queue_name,), burst=True,
                                                 metrics=False,
                                                 install_signal_handlers=False))
    assert asyncio.run(w.run()) == 0
    assert {w.state.scripts.by_name[n].fname for n in PRELOADED_SCRIPTS} <= \
        function_libraries(redis_client)
