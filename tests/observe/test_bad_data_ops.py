"""Issue 10, poisoned data on the operator's paths: ``Queue.stats``, ``/metrics`` and the
dead-letter listing never crash on what was written into Redis by hand.

Before: an entry with a valid header and a body of the wrong types at the head of a ready
list made ``Queue.stats`` raise (and ``batchq info`` with it) and every ``/metrics``
scrape drop; a malformed name in the registry of queues made ``/metrics`` report
``batchq_redis_up 0`` without any queue gauge; a dead id that is not UTF-8 made
``Queue.dead_ids`` (and the dead listing) fail for the whole queue.
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

import batchq
from batchq.ops import metrics_http
from batchq.store import codec
from batchq.store.keys import queues_key

pytestmark = pytest.mark.fault

BAD_ID = b"\xff\xfeid"


@pytest.fixture
def app(redis_url: str, namespace: str) -> Iterator[batchq.App]:
    a = batchq.App(redis_url, namespace=namespace)

    @a.task(queue="poisoned")
    def job(x: int) -> None: ...

    @a.task(queue="fine", name="other")
    def other(x: int) -> None: ...

    yield a
    a.close()


def _poison_heads(app: batchq.App, r: redis.Redis) -> None:
    """Good jobs behind two bad heads: wrong field types, and a body that is not msgpack."""
    app.tasks["job"].options(priority=5).enqueue(1)
    app.tasks["job"].options(priority=3).enqueue(2)
    k = app.keys("poisoned")
    wrong_types = msgpack.packb(["job", [1], {}, "not-an-int", {"due": "x"}])
    r.lpush(k.ready_for(5), b"5:0:3:handwrittenA:" + wrong_types)
    r.lpush(k.ready_for(3), b"3:0:3:handwrittenB:\xc1\xc1 not msgpack")
    app.tasks["job"].enqueue(0)  # priority 0: a good head


def test_stats_flags_malformed_heads_and_counts_everything(app: batchq.App,
                                                           redis_client: redis.Redis) -> None:
    _poison_heads(app, redis_client)
    st = app.queue("poisoned").stats()
    assert (st.ready, st.delayed, st.reserved, st.dead) == (5, 0, 0, 0)
    assert st.ready_by_priority == {5: 2, 3: 2, 0: 1}
    assert st.malformed_heads == (5, 3)
    assert 0 <= st.oldest_age_s < 60  # from the good head at priority 0
    assert app.queue("fine").stats().malformed_heads == ()


def _scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_metrics_keep_every_queue_gauge_despite_bad_heads_and_names(
        app: batchq.App, redis_client: redis.Redis, tmp_path: Path) -> None:
    _poison_heads(app, redis_client)
    app.tasks["other"].enqueue(7)
    registry = queues_key(app.namespace)
    redis_client.sadd(registry, b"\xff\xfe", b"a{b}", b"x y", b"c:d")

    server = metrics_http.make_server(app, "127.0.0.1", 0, multiproc_dir=str(tmp_path),
                                 parent_pid=None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        got = _scrape(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
    assert got["batchq_redis_up"] == {(): 1.0}
    jobs = got["batchq_queue_jobs"]
    assert jobs[(("queue", "poisoned"), ("state", "ready"))] == 5
    assert jobs[(("queue", "fine"), ("state", "ready"))] == 1
    assert got["batchq_queue_malformed_heads"] == {(("queue", "fine"),): 0,
                                                   (("queue", "poisoned"),): 2}
    assert got["batchq_queue_names_malformed"] == {(): 4}
    assert {dict(k)["queue"] for k in got["batchq_queue_oldest_job_age_seconds"]} == {
        "fine", "poisoned"}


def test_dead_listing_survives_ids_and_records_written_by_hand(
        app: batchq.App, redis_client: redis.Redis) -> None:
    q = app.queue("poisoned")
    k = q.keys
    good_raw = b"0:3:3:goodid:" + msgpack.packb(["job", [1], {}, 1])
    records = {
        b"goodid": codec.encode_dead_record("goodid", "failed", good_raw),
        BAD_ID: codec.encode_dead_record("?", "failed", b"0:3:3:" + BAD_ID + b":" +
                                         msgpack.packb(["job", [2], {}, 1])),
        b"corrupt": b"\xc1 not a record",
        b"rawint": msgpack.packb({"reason": "failed", "raw": 5}),
        b"rawbody": codec.encode_dead_record("rawbody", "decode_error",
                                             b"0:1:3:rawbody:" + msgpack.packb([1, 2, 3, 4])),
    }
    for n, (jid, rec) in enumerate(records.items()):
        redis_client.hset(k.dead_jobs, jid, rec)
        redis_client.zadd(k.dead, {jid: 1000 + n})

    ids = q.dead_ids()
    assert len(ids) == 5
    assert ids[0] == "goodid"
    bad = ids[1]
    assert bad.encode("utf-8", "surrogateescape") == BAD_ID
    jobs = {j.id: j for j in q.dead_jobs()}
    assert set(jobs) == set(ids)
    assert jobs["goodid"].task == "job" and jobs["goodid"].args == [1]
    assert jobs["corrupt"].reason == "corrupt_record"
    assert jobs["rawint"].task is None and jobs["rawbody"].task is None
    assert q.dead_jobs(ids=[bad])[0].reason == "failed"

    # redrive everything with a usable header (the body is the worker's to judge); the
    # rest stays, and nothing crashes
    assert q.retry_dead() == 2
    assert q.stats().ready == 2
    assert sorted(q.dead_ids()) == sorted([bad, "corrupt", "rawint"])
    assert q.purge_dead([bad]) == 1
    assert redis_client.zscore(k.dead, BAD_ID) is None
    assert sorted(q.dead_ids()) == ["corrupt", "rawint"]
