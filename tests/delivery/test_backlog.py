"""Fault 7 (part 2): a huge backlog of delayed jobs coming due at once.

200,000 (1,000,000 in the slow test) jobs scheduled for the same instant on queue
``bulk``; once they are due a single worker serving ``bulk`` and ``live`` starts.
``pop.lua`` moves at most 100 due jobs per call, so no call grows with the backlog:
every pop stays short (the server's SLOWLOG holds every command slower than 1 ms, and
99 % of the pops there must take under 50 ms), the ready list never holds more than a few
chunks, and jobs enqueued to ``live`` meanwhile start within a second.
"""

from __future__ import annotations

import threading
import time

import checker
import pytest
from apps import fault_app
from fixtures.faults import *  # noqa: F403
from fixtures.faults import FleetFactory

from batchq.dev.server import EmbeddedServer
from batchq.store.scripts import _Lua, calls
from batchq.store.scripts.replies import decode_pop_reply

pytestmark = pytest.mark.fault

POP_SHA = _Lua("pop").sha.encode()
SLOWLOG_US = 1_000


# the 1M case: enqueue, drain and check take 110 s on a 2-core box with a slow hour,
# against the suite's 120 s per test; its own drain budget below is 60 + n / 2000 s
@pytest.mark.parametrize("n", [200_000, pytest.param(1_000_000, marks=[
    pytest.mark.slow, pytest.mark.timeout(600)])], ids=["200k", "1M"])
def test_a_backlog_of_delayed_jobs_coming_due_at_once(fleet_on: FleetFactory,
                                                      n: int) -> None:
    with EmbeddedServer(extra_args=["--slowlog-log-slower-than", str(SLOWLOG_US),
                                    "--slowlog-max-len", "100000"]) as server:
        fleet = fleet_on(server.url)
        r = fleet.r
        bk = fleet.app.keys("bulk")
        due_at = time.time() + 1.0
        t0 = time.monotonic()
        fleet.app.tasks["bulk"].options(queue="bulk", eta=due_at).enqueue_many(
            (f"b{i}",) for i in range(n))
        enqueue_s = time.monotonic() - t0
        assert r.zcard(bk.delayed) == n
        time.sleep(max(0.0, due_at + 0.1 - time.time()))  # all due now

        # one pop by hand first: it moves one chunk, however large the backlog
        t1 = time.perf_counter()
        head = decode_pop_reply(fleet.app.sync_scripts.call(calls.pop(bk, 0, 30_000, 100)))
        one_pop_ms = (time.perf_counter() - t1) * 1000
        assert head.promoted == 100 and r.llen(bk.ready_for(0)) == 100, head[:7]
        r.slowlog_reset()

        samples: list[tuple[int, int]] = []
        live: dict[str, float] = {}
        stop = threading.Event()
        live_task = fleet.app.tasks["work"].options(queue="live")

        def watch() -> None:
            i = 0
            while not stop.is_set():
                samples.append((int(r.llen(bk.ready_for(0))), int(r.zcard(bk.delayed))))
                if i % 4 == 0:
                    tok = f"v{i // 4}"
                    live[tok] = fault_app.now()
                    live_task.enqueue(tok)
                i += 1
                time.sleep(0.05)

        w = fleet.start("-q", "bulk,live", "-c", "100", "--fetch-batch", "100")
        t2 = time.monotonic()
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            fleet.until(lambda: not (r.zcard(bk.delayed) or r.llen(bk.ready_for(0))
                                     or r.zcard(bk.reserved) or r.zcard(bk.bundles)),
                        60 + n / 2000,
                        "the backlog drained", interval_s=0.2)
            drain_s = time.monotonic() - t2
            time.sleep(0.3)
        finally:
            stop.set()
            watcher.join(5)
        fleet.settle(("bulk", "live"))

        slow = [e for e in r.slowlog_get(100_000)
                if e["command"].startswith((b"EVALSHA " + POP_SHA,
                                            b"FCALL batchq_pop_" + POP_SHA))]
        slow_ms = sorted(e["duration"] / 1000 for e in slow)
        worst_ms = slow_ms[-1] if slow_ms else 0.0
        p99_ms = slow_ms[int(0.99 * (len(slow_ms) - 1))] if slow_ms else 0.0
        runs = fleet.runs()
        starts = {x.token: x.start for x in runs if x.token in live}
        waits = sorted(starts[t] - live[t] for t in live if t in starts)
        max_ready = max(s[0] for s in samples)
        report = fleet.check([f"b{i}" for i in range(n)] + list(live),
                             queues=("bulk", "live"), killed_pids=())
        print(f"\n{n} delayed jobs: enqueued in {enqueue_s:.1f}s, drained in {drain_s:.1f}s "
              f"({n / drain_s:.0f}/s); one pop by hand {one_pop_ms:.1f} ms; pops slower "
              f"than {SLOWLOG_US / 1000:g} ms: {len(slow)} (p99 {p99_ms:.1f} ms, worst "
              f"{worst_ms:.1f} ms); ready "
              f"list at most {max_ready}; {len(live)} live jobs started "
              f"{waits[0] * 1000:.0f}..{waits[-1] * 1000:.0f} ms after enqueue\n"
              f"checker: {report.summary()}")
        assert one_pop_ms < 50
        # a pop that grew with the backlog would be slow on every call (each would walk
        # it); the single slowest of some 10,000 calls (here 2-3 ms each) measures the
        # shared box's scheduler (72 ms once on a 2-core box): so the 99th percentile
        assert p99_ms < 50, slow_ms[-20:]
        # every pop promotes one chunk (100) and takes what the worker can start soon (its
        # prefetch is sized from run time), so due jobs may gather in ready: a chunk per
        # pop, never the whole backlog at once (the pop by hand above moved exactly one)
        assert max_ready <= n // 10, "due jobs were moved in bulk, not in chunks"
        assert len(waits) == len(live) >= 5
        assert waits[-1] < 1.0, waits[-5:]
        assert w.poll() is None
        assert report.valid, report.details()
        assert checker.leftovers(r, fleet.ns, ("bulk", "live")) == []
