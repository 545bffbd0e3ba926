"""Issue 10: entries written into Redis by hand, that no producer would write.

* a valid header with a msgpack body whose fields have the wrong type (times that are
  not integers, args not a list, kwargs not a str-keyed map, task not a str, not a
  list, too few fields) or an id that is not ASCII: the worker dead-letters each as
  ``decode_error``, naming the field, and never wedges;
* header numbers the scripts cannot round-trip (Lua writes 10**14 back as ``1e+14``):
  ``pop.lua`` dead-letters them as ``decode_error`` instead of losing them in the
  in-flight hash; identical malformed entries each keep their own dead record.
"""

from __future__ import annotations

from typing import Any

import checker
import msgpack
import pytest
from fixtures.faults import *  # noqa: F403
from fixtures.fleet import Fleet

from batchq.store import codec

pytestmark = pytest.mark.fault


def _entry(jid: str, body: Any, header: bytes = b"0:0:3:") -> bytes:
    return header + jid.encode() + b":" + msgpack.packb(body)


BAD_BODIES: dict[str, Any] = {
    "enqueued-str": ["work", ["x"], {}, "yesterday"],
    "enqueued-float": ["work", ["x"], {}, 1.5],
    "enqueued-bool": ["work", ["x"], {}, True],
    "due-str": ["work", ["x"], {}, 1, "soon"],
    "args-dict": ["work", {"a": 1}, {}, 1],
    "kwargs-intkey": ["work", ["x"], {1: 2}, 1],
    "kwargs-list": ["work", ["x"], [1], 1],
    "task-int": [5, ["x"], {}, 1],
    "not-a-list": {"task": "work"},
    "three-fields": ["work", ["x"], {}],
    "six-fields": ["work", ["x"], {}, 1, 2, 3],
}


def test_wrong_typed_bodies_and_out_of_range_headers_are_dead_lettered(fleet: Fleet) -> None:
    """Fixed: a body with a non-integer enqueue or due time crashed the runner in the
    metrics code (the job never dead-lettered, its lease extended for ever; a few of
    them stopped the worker, and a burst run never ended); ``max_attempts`` or
    ``attempt`` above 12 digits became ``1e+14`` in Lua and the job vanished into the
    in-flight hash; identical malformed entries shared one dead record."""
    k = fleet.app.keys("default")
    healthy = [f"h{i}" for i in range(30)]
    fleet.app.tasks["work"].enqueue_many([(t, 0.0) for t in healthy])
    bad = [_entry(name, body) for name, body in BAD_BODIES.items()]
    bad.append(b"0:0:3:\xff\xfeid:" + msgpack.packb(["work", ["x"], {}, 1]))  # not ASCII
    good_body = msgpack.packb(["work", ["big"], {}, 1])
    huge = [b"0:0:100000000000000:max14:" + good_body,       # max_attempts 10**14
            b"0:100000000000000000000:3:att20:" + good_body,  # attempt 10**20
            b"0:0:1e+14:expo:" + good_body]
    twins = [b"0:0:100000000000000:twin:" + good_body] * 2
    fleet.r.rpush(k.ready_for(0), *bad[:6], *huge, *twins, *bad[6:])

    fleet.drain("-c", "2", "--fetch-batch", "4", "--lease-s", "5", timeout_s=30)

    # read raw: a non-UTF-8 id is the dead store's own concern (Queue.dead_jobs)
    dead = [codec.decode_dead_record(v) for v in fleet.r.hvals(k.dead_jobs)]
    assert all(d["reason"] == "decode_error" for d in dead), dead
    assert len(dead) == len(bad) + len(huge) + len(twins) == fleet.r.zcard(k.dead)
    # (bodies found bad by the worker are recorded as reserved: attempt counted)
    assert sorted(d["raw"].split(b":", 4)[3] for d in dead) == sorted(
        e.split(b":", 4)[3] for e in bad + huge + twins)
    messages = " | ".join(str(d["error_message"]) for d in dead)
    for field in ("enqueued_at should be int, not str", "args should be list",
                  "kwargs should be dict", "task should be str", "keyword 1",
                  "malformed job header"):
        assert field in messages, (field, messages)
    report = checker.check(healthy, fleet.runs(), {})  # (not through Queue.dead_jobs)
    assert report.valid and report.completed == len(healthy), report.details()
    assert fleet.leftovers() == []
