"""Delivery: exactly-once in the happy path, priorities, delays, fairness, leases,
idle behaviour and enqueue-time validation, with real worker processes."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from fixtures.basic import *  # noqa: F403
from fixtures.runs import pending_keys, server_time_s, wait_exit
from helpers import wait_until

import batchq
from batchq.worker.registry import REGISTRY_EVERY_S
from batchq.worker.worker import SHARDS_EVERY_S

pytestmark = pytest.mark.integration


def test_ten_thousand_jobs_run_exactly_once(app, queue_name, start_worker, runs, redis_client):
    ids = app.tasks["noop"].options(queue=queue_name).enqueue_many(range(10_000))
    assert len(set(ids)) == 10_000

    worker = start_worker(queue_name, "--burst", wait_ready=False)
    assert wait_exit(worker, 60) == 0, worker.read_log()

    seen = Counter(r.token for r in runs("noop"))
    assert set(seen) == {str(i) for i in range(10_000)}
    assert set(seen.values()) == {1}, [t for t, n in seen.items() if n > 1][:10]
    stats = app.queue(queue_name).stats()
    assert (stats.ready, stats.delayed, stats.reserved, stats.dead) == (0, 0, 0, 0)
    k = app.keys(queue_name)
    assert redis_client.exists(k.reserved, k.bundles, k.inflight, k.delayed, *k.ready) == 0
    assert pending_keys(redis_client, app, queue_name) == \
        {"ready": 0, "delayed": 0, "reserved": 0, "inflight": 0}


def test_priorities_high_before_low_fifo_within_a_level(app, queue_name, start_worker, runs):
    noop = app.tasks["noop"]
    low = noop.options(queue=queue_name, priority=0)
    high = noop.options(queue=queue_name, priority=9)
    # interleaved while no worker runs: L0-9, H0-9, L10-19, H10-19
    for part in range(2):
        low.enqueue_many([f"L{i}" for i in range(part * 10, part * 10 + 10)])
        high.enqueue_many([f"H{i}" for i in range(part * 10, part * 10 + 10)])
    assert app.queue(queue_name).stats().ready_by_priority == {9: 20, 0: 20}

    worker = start_worker(queue_name, "-c", "1", "--fetch-batch", "1", "--burst",
                          wait_ready=False)
    assert wait_exit(worker, 30) == 0, worker.read_log()

    order = [r.token for r in runs("noop")]
    assert order == [f"H{i}" for i in range(20)] + [f"L{i}" for i in range(20)]


def test_delayed_jobs_start_when_due_not_before(app, queue_name, start_worker, runs,
                                                redis_client):
    start_worker(queue_name)
    noop = app.tasks["noop"].options(queue=queue_name)
    # server clock minus this host's clock (0 for the embedded server)
    skew = server_time_s(redis_client) - time.time()

    def started(token: str) -> float:
        run = wait_until(lambda: [r for r in runs("noop") if r.token == token],
                         timeout_s=10, message=f"job {token} did not run")[0]
        return run.t + skew  # in server time

    # delay_s: due = server TIME at enqueue + 0.5 s
    before = server_time_s(redis_client)
    noop.options(delay_s=0.5).enqueue("delay")
    assert app.queue(queue_name).stats().delayed == 1
    t = started("delay")
    assert t >= before + 0.5 - 0.005, f"started {before + 0.5 - t:.3f}s before it was due"
    assert t < before + 0.5 + 1.0, f"started {t - before - 0.5:.3f}s late"

    # eta: a naive (local time) and an aware datetime
    for token, eta in (("naive", datetime.now() + timedelta(seconds=0.6)),
                       ("aware", datetime.now(UTC) + timedelta(seconds=0.6))):
        noop.options(eta=eta).enqueue(token)
        t = started(token)
        due = eta.timestamp()
        assert t >= due - 0.005, f"{token}: started {due - t:.3f}s before its eta"
        assert t < due + 1.0, f"{token}: started {t - due:.3f}s late"


def test_fairness_small_queue_not_starved_by_big_one(app, queue_name, start_worker, runs):
    qa, qb = f"{queue_name}a", f"{queue_name}b"
    noop = app.tasks["noop"]
    noop.options(queue=qa).enqueue_many([f"a{i}" for i in range(10_000)])
    noop.options(queue=qb).enqueue_many([f"b{i}" for i in range(50)])

    worker = start_worker([qa, qb], "-c", "10", "--fetch-batch", "10", "--burst",
                          wait_ready=False)
    assert wait_exit(worker, 60) == 0, worker.read_log()

    order = [r.token for r in runs("noop")]
    assert len(order) == 10_050
    last_b = max(i for i, tok in enumerate(order) if tok.startswith("b"))
    a_before = sum(1 for tok in order[:last_b] if tok.startswith("a"))
    assert a_before < 5_000, f"{a_before} jobs of a ran before b was done"


def test_lease_extended_while_a_long_job_runs(app, queue_name, start_worker, runs):
    app.tasks["nap_job"].options(queue=queue_name).enqueue(3.0)
    worker = start_worker(queue_name, "--lease-s", "1", "--burst", wait_ready=False)
    assert wait_exit(worker, 30) == 0, worker.read_log()

    starts, ends = runs("start"), runs("end")
    assert [r.attempt for r in starts] == [1], starts  # no redelivery
    assert [r.attempt for r in ends] == [1]
    assert ends[0].t - starts[0].t >= 2.9
    assert "expired before they could be extended" not in worker.read_log()
    assert app.queue(queue_name).stats().pending == 0


def _client_cmds(r, exclude: set[int]) -> dict[int, int] | None:
    """tot-cmds (commands a client sent, not counting those run inside its scripts) per
    client id; None when the server's CLIENT LIST lacks the field (Redis < 7.4)."""
    out = {}
    for c in r.client_list():
        if "tot-cmds" not in c:
            return None
        if int(c["id"]) not in exclude:
            out[int(c["id"])] = int(c["tot-cmds"])
    return out


def _commandstats(r) -> dict[str, int]:
    return {k: int(v["calls"]) for k, v in r.info("commandstats").items()}


def test_idle_worker_blocks_instead_of_polling(app, queue_name, start_worker, runs,
                                               redis_client):
    r = redis_client
    before_worker = {int(c["id"]) for c in r.client_list()} | {int(r.client_id())}
    start_worker(queue_name)
    # let the startup settle (queue and shard registration, first pop, BLPOP; slower on a
    # loaded box, where 0.5 s once left startup commands inside the window)
    time.sleep(1.5)

    c0, s0 = _client_cmds(r, before_worker), _commandstats(r)
    window = 3.0
    time.sleep(window)
    c1, s1 = _client_cmds(r, before_worker), _commandstats(r)

    if c0 is not None and c1 is not None:
        assert c0, "no worker connection found"
        sent = sum(n - c0.get(i, 0) for i, n in c1.items())
        # what an idle worker sends, at most, in the window: its heartbeat (ZADD + EXPIRE
        # every REGISTRY_EVERY_S), one pop and one BLPOP per max_block_s (5 s), the
        # shard-count refresh (SHARDS_EVERY_S) and the campaign safety net (>= 7.5 s
        # apart; its first look, 1-15 s after start, opens the sync client's connection:
        # PING + HELLO before its one command): 10 in 3 s. A worker polling even 5 times
        # a second sends 15 or more.
        budget = (2 * math.ceil(window / REGISTRY_EVERY_S) + 2 * math.ceil(window / 5.0)
                  + math.ceil(window / SHARDS_EVERY_S) + 3)
        assert sent <= budget, f"idle worker sent {sent} commands in {window}s " \
                               f"(at most {budget} expected)"
    # INFO commandstats counts the redis.call()s inside scripts as well (an empty pop
    # is ~16 of them), so count the calls that start work: scripts, blocking pops, pings
    entry = {"cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall", "cmdstat_blpop",
             "cmdstat_brpop", "cmdstat_ping"}
    top = sum(s1.get(k, 0) - s0.get(k, 0) for k in entry)
    assert top / window <= 2, f"{top} script/blocking calls in {window}s: {s0} -> {s1}"

    # an enqueue wakes it at once
    t_enq = time.time()
    app.tasks["noop"].options(queue=queue_name).enqueue("wake")
    run = wait_until(lambda: runs("noop"), timeout_s=5)[0]
    assert run.t - t_enq < 0.2, f"job started {run.t - t_enq:.3f}s after enqueue"


def test_a_blocking_wait_that_outlives_its_idle_wait_is_sent_again(app, queue_name,
                                                                   redis_client):
    """An idle wait reuses the BLPOP still pending from the one before; when that BLPOP
    ends on the server's timeout midway, the wait goes on (a new BLPOP) to its own end
    instead of sending the fetch loop back for a second pop right after the first (an
    idle worker popped twice per max_block_s)."""
    s = batchq.WorkerSettings(queues=(queue_name,), install_signal_handlers=False,
                              metrics=False, max_block_s=0.5)
    w = batchq.Worker(app, s)

    async def go() -> tuple[float, float]:
        st, waiter = w.state, w.fetcher.waiter
        await st.open()
        try:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await waiter.wait(0.1)  # ends at 0.1 s, its BLPOP (0.5 s) still pending
            t1 = loop.time()
            await waiter.wait(1.0)  # that BLPOP times out about 0.4 s in
            return t1 - t0, loop.time() - t1
        finally:
            await waiter.close()
            await st.redis.aclose()
            await st.bredis.aclose()

    blpops0 = _commandstats(redis_client).get("cmdstat_blpop", 0)
    first, second = asyncio.run(go())
    blpops = _commandstats(redis_client).get("cmdstat_blpop", 0) - blpops0
    assert 0.09 <= first < 0.4
    assert second >= 0.95, f"the idle wait ended after {second:.2f}s, not 1 s"
    assert 2 <= blpops <= 3, blpops
    # a token still ends it at once
    redis_client.rpush(app.keys(queue_name).wake, "1")
    first, second = asyncio.run(go())
    assert first < 0.09, first


def test_unencodable_argument_is_a_clear_error_and_writes_nothing(app, queue_name,
                                                                  namespace, redis_client):
    noop = app.tasks["noop"].options(queue=queue_name)
    with pytest.raises(TypeError, match=r"positional argument 0 \(set\)"):
        noop.enqueue(set())
    with pytest.raises(TypeError, match=r"keyword argument 'token' \(set\)"):
        noop.enqueue(token={1, 2})
    assert list(redis_client.scan_iter(match=f"{namespace}*")) == []

    # enqueue_many: the bad item fails the call before any job is written
    with pytest.raises(TypeError, match=r"positional argument 0 \(set\)"):
        noop.enqueue_many([1, 2, (set(),), 4])
    k = app.keys(queue_name)
    assert redis_client.exists(*k.all()) == 0
