"""``enqueue_many(group_fn=...)``: the jobs of many groups in one call write exactly what
one ``options(group=g).enqueue_many`` per group writes (each group's ready jobs in
order, the rotation, the quota counts, campaign totals, dedup keys held, ids in input
order), in a few script calls; rows without a group; values refused; the asyncio twin;
a quota refusal names its group."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from fixtures.campaigns import *  # noqa: F403

import batchq
from batchq.flow.limits import group_hex
from batchq.store import codec
from batchq.store.scripts import calls

pytestmark = pytest.mark.integration

GROUPS = 7
PER = 300  # 2,100 rows: three chunks, groups across chunk borders


def _rows(n: int = GROUPS * PER) -> list[tuple[int, str]]:
    return [(i, f"user{i}@example.com") for i in range(n)]


def _group(row: tuple[int, str]) -> str:
    return f"g{row[0] // PER}"


def _args(entry: bytes, queue: str) -> list[Any]:
    return list(codec.decode_entry(entry, queue).args)


def _snapshot(app: batchq.App, queue: str) -> dict[str, Any]:
    """What a queue holds, ids left out (they differ between two writes): each group's
    ready jobs in gready order with their place, the rotation, the group counts, the
    plain ready list, the delayed jobs, the waiting bits and the stats."""
    r, k = app.redis, app.keys(queue)
    gready = []
    for m in r.zrange(k.gready, 0, -1):
        cut = m.index(b"~") + 15  # "<g>~<9 - priority><13 hex position>"
        gready.append((m[:cut], _args(m[cut:], queue)))
    gstate = {f: v for f, v in r.hgetall(k.gstate).items()}
    return {"gready": gready, "groups": r.zrange(k.groups, 0, -1, withscores=True),
            "gstate": gstate,
            "ready": [_args(e, queue) for e in r.lrange(k.ready_for(0), 0, -1)],
            "delayed": sorted(str(_args(e, queue)) for e in r.zrange(k.delayed, 0, -1)),
            "waiting": sum(r.bitcount(getattr(k, f"waiting{s}")) for s in range(4)),
            "jobmeta": r.hlen(k.jobmeta), "dedup": r.hlen(k.dedup),
            "enqueued": r.hget(k.stats, "enqueued")}


def _loop(task: Any, rows: list[Any], group: Callable[[Any], str | None],
          key_fn: Any = None) -> list[str]:
    """The per-group loop the docs used to show: one enqueue_many per run of a group."""
    ids: list[str] = []
    i = 0
    while i < len(rows):
        j = i
        while j < len(rows) and group(rows[j]) == group(rows[i]):
            j += 1
        g = group(rows[i])
        ids += (task.options(group=g) if g is not None else task).enqueue_many(
            rows[i:j], key_fn=key_fn)
        i = j
    return ids


def _calls(r: redis.Redis) -> int:
    st = r.info("commandstats")
    return sum(int(v["calls"]) for name, v in st.items()
               if name in ("cmdstat_evalsha", "cmdstat_fcall", "cmdstat_eval"))


def test_group_fn_writes_what_the_per_group_loop_writes(app, redis_client):
    send = app.tasks["send"]
    rows = _rows()
    redis_client.config_resetstat()
    _loop(send.options(queue="la"), rows, _group)
    loop_calls = _calls(redis_client)
    redis_client.config_resetstat()
    ids = send.options(queue="ga").enqueue_many(rows, group_fn=_group)
    # three chunks, whatever the groups (and the sequence numbers' blocks, as the loop)
    assert _calls(redis_client) <= 6 < GROUPS + 3 <= loop_calls
    assert len(ids) == len(rows) == len(set(ids))
    # ids in input order, each with its own group
    for row, jid in zip(rows, ids, strict=True):
        assert jid.endswith("~" + group_hex(_group(row)))
    a, b = _snapshot(app, "la"), _snapshot(app, "ga")
    assert a == b
    assert len(a["gready"]) == len(rows) and a["waiting"] == len(rows)
    assert [g for g, _ in a["groups"]] == sorted(group_hex(f"g{i}").encode()
                                                 for i in range(GROUPS))
    assert app.redis.hget(app.keys("ga").gstate, group_hex("g3") + ":n") == b"%d" % PER


def test_interleaved_groups_keep_each_groups_order(app):
    send = app.tasks["send"]
    rows = _rows(1500)

    def rr(row: tuple[int, str]) -> str:
        return f"r{row[0] % 5}"

    send.options(queue="ga").enqueue_many(rows, group_fn=rr)
    k = app.keys("ga")
    got: dict[str, list[int]] = {}
    for m in app.redis.zrange(k.gready, 0, -1):
        cut = m.index(b"~") + 15
        got.setdefault(m[:m.index(b"~")].decode(), []).append(_args(m[cut:], "ga")[0])
    assert got == {group_hex(f"r{g}"): list(range(g, 1500, 5)) for g in range(5)}


def test_fanout_with_campaign_and_keys_equals_the_loop(app, redis_client):
    send = app.tasks["send"]
    rows = _rows()
    tag = uuid.uuid4().hex[:6]

    def key(row: tuple[int, str]) -> str:
        return f"{tag}:{row[1]}"

    c1, c2 = app.campaign(), app.campaign()
    loop_ids = _loop(send.options(queue="la", campaign=c1), rows, _group, key)
    ids = send.options(queue="ga", campaign=c2).enqueue_many(rows, key_fn=key,
                                                             group_fn=_group)
    assert _snapshot(app, "la") == _snapshot(app, "ga")
    assert c1.stats().total == c2.stats().total == len(rows)
    assert all(j.endswith("~" + group_hex(_group(r)) + "_m")
               for r, j in zip(rows, ids, strict=True))
    # run again: every key is held; nothing written, the holders' ids in input order
    again = send.options(queue="ga", campaign=c2).enqueue_many(
        list(reversed(rows)), key_fn=key, group_fn=_group)
    assert again == list(reversed(ids))
    assert _snapshot(app, "ga") == _snapshot(app, "la")
    assert c2.stats().total == len(rows)
    # a key repeated inside the call: the first row holds it, later rows get its id
    dup = [(9000 + i % 3, f"dup{i % 3}") for i in range(9)]
    got = send.options(queue="ga", campaign=c2).enqueue_many(
        dup, key_fn=key, group_fn=lambda row: f"d{row[1]}")
    assert got[3:] == got[:3] * 2 and len(set(got)) == 3
    assert len(loop_ids) == len(rows)


def test_rows_without_a_group_and_the_options_group(app):
    send = app.tasks["send"]
    rows = _rows(60)

    def some(row: tuple[int, str]) -> str | None:
        return None if row[0] % 3 == 0 else f"s{row[0] % 2}"

    _loop(send.options(queue="la"), rows, some)
    send.options(queue="ga").enqueue_many(rows, group_fn=some)
    a, b = _snapshot(app, "la"), _snapshot(app, "ga")
    assert a == b and len(a["ready"]) == 20 and len(a["gready"]) == 40
    # None: the group of options(group=...)
    ids = send.options(queue="oa", group="base").enqueue_many(rows, group_fn=some)
    n = app.redis.hget(app.keys("oa").gstate, group_hex("base") + ":n")
    assert n == b"20" and not app.redis.llen(app.keys("oa").ready_for(0))
    assert [j.endswith("~" + group_hex("base")) for j in ids] == \
        [r[0] % 3 == 0 for r in rows]


def test_delayed_rows_of_several_groups(app):
    send = app.tasks["send"]
    rows = _rows(40)
    _loop(send.options(queue="la", delay_s=60), rows, lambda r: f"d{r[0] % 2}")
    send.options(queue="ga", delay_s=60).enqueue_many(rows, group_fn=lambda r: f"d{r[0] % 2}")
    a, b = _snapshot(app, "la"), _snapshot(app, "ga")
    assert a == b and len(a["delayed"]) == 40 and not a["gready"]
    assert a["gstate"][(group_hex("d1") + ":n").encode()] == b"20"


@pytest.mark.parametrize("value, error, words", [
    (5, TypeError, "group_fn must return a str or None, got int 5"),
    (b"g", TypeError, "got bytes"),
    ("", ValueError, "must not be empty"),
    ("*", ValueError, "reserved"),
])
def test_bad_group_values_are_refused_naming_the_item(app, value, error, words):
    send = app.tasks["send"].options(queue="ga")
    rows = _rows(5)
    with pytest.raises(error) as info:
        send.enqueue_many(rows, group_fn=lambda row: value if row[0] == 3 else "ok")
    assert str(info.value).startswith("item 3: ") and words in str(info.value)
    if error is TypeError:
        assert "(3, 'user3@example.com')" in str(info.value)
    assert not app.redis.exists(app.keys("ga").gready)  # the chunk never went


def test_group_fn_must_be_callable_and_is_not_for_sharded_queues(app):
    send = app.tasks["send"]
    with pytest.raises(TypeError, match="group_fn must be callable"):
        send.enqueue_many([1], group_fn="g")  # type: ignore[arg-type]
    app.queue("sh", shards=2)
    with pytest.raises(ValueError, match="group_fn is not supported there"):
        send.options(queue="sh").enqueue_many([1], group_fn=str)


def test_a_quota_refusal_names_its_group(app):
    send = app.tasks["send"].options(queue="ga")
    app.queue("ga").limit("g1", max_pending=100)
    rows = _rows(1500)  # chunk 1: g0 x 300, g1 x 300, ...: g1 is over its quota
    with pytest.raises(batchq.QuotaExceeded) as info:
        send.enqueue_many(rows, group_fn=_group)
    assert info.value.group == "g1" and info.value.written == 0
    assert not app.redis.exists(app.keys("ga").gready)
    # within the quota: written
    app.queue("ga").limit("g1", max_pending=400)
    assert len(send.enqueue_many(rows, group_fn=_group)) == 1500


def test_async_twin_writes_the_same(app):
    send = app.tasks["send"]
    rows = _rows()
    tag = uuid.uuid4().hex[:6]

    def key(row: tuple[int, str]) -> str:
        return f"{tag}:{row[1]}"

    c1, c2 = app.campaign(), app.campaign()
    send.options(queue="la", campaign=c1).enqueue_many(rows, key_fn=key, group_fn=_group)
    ids = asyncio.run(send.options(queue="ga", campaign=c2).aenqueue_many(
        rows, key_fn=key, group_fn=_group))
    assert len(ids) == len(rows)
    assert _snapshot(app, "la") == _snapshot(app, "ga")
    assert c2.stats().total == len(rows)


def test_a_fanout_written_by_group_fn_runs_every_job_once(app, drain, redis_client, namespace):
    send = app.tasks["send"]
    c = app.campaign()
    rows = [(i,) for i in range(400)]
    send.options(campaign=c).enqueue_many(rows, key_fn=lambda row: f"k{row[0]}",
                                          group_fn=lambda row: f"t{row[0] % 40}")
    c.seal()
    drain("a")
    ran = sorted(int(x) for x in redis_client.lrange(f"{namespace}:ran", 0, -1))
    assert ran == list(range(400))
    s = c.stats()
    assert (s.done, s.total, s.succeeded) == (True, 400, 400)


def test_the_scripts_refuse_group_runs_that_do_not_match_their_rows(app):
    k = app.keys("ga")
    scripts = app.clients.sync_scripts
    rows = [b"0:0:3:aaaaaaaaaaaaaaaaa-1~67:x", b"0:0:3:aaaaaaaaaaaaaaaaa-2~67:x"]
    with pytest.raises(redis.ResponseError, match="runs count 1 rows, not 2"):
        scripts.call(calls.enqueue_groups(k, "67:1", 0, "ready", 0, rows, check=False))
    with pytest.raises(redis.ResponseError, match="shorter than the rows"):
        scripts.call(calls.enqueue_tracked(k, 0, "ready", 0, "", 1000, 100,
                                           [rows[0], b"", rows[1], b""], check=False,
                                           groups="67:1"))
    assert not app.redis.exists(k.gready) and not app.redis.exists(k.jobmeta)
    assert calls.group_runs(["a", "a", "", "b", "a"]) == "a:2,:1,b:1,a:1"
