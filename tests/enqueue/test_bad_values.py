"""Issue 10, bad values at enqueue: anything the worker cannot run is refused by the
producer with a message naming the option or argument, and nothing is written for it.

Before: ``delay_s=nan`` ran the job at once, ``inf`` raised a bare ``OverflowError``, a
huge delay a message without the word delay, ``priority="x"`` a raw comparison error,
``options(queue="")`` fell back to the task's queue, a string ``eta`` and a dict with
tuple keys were accepted (the latter then dead-lettered by the worker), and
``max_attempts=10**14`` was accepted although Lua prints it as ``1e+14``.

The values that are accepted at the edges (``max_attempts=codec.MAX_ATTEMPTS``,
``delay_s=0``, int keys) really run: a burst fleet drains them and the checker holds.
"""

from __future__ import annotations

import asyncio
import math
from datetime import datetime
from typing import Any

import pytest
from fixtures.faults import *  # noqa: F403
from fixtures.fleet import Fleet

import batchq
from batchq.store import codec

pytestmark = pytest.mark.fault

BAD_OPTIONS: list[tuple[dict[str, Any], str]] = [
    ({"delay_s": math.nan}, "delay_s"),
    ({"delay_s": math.inf}, "delay_s"),
    ({"delay_s": -math.inf}, "delay_s"),
    ({"delay_s": 1e30}, "delay_s"),
    ({"delay_s": -1}, "delay_s"),
    ({"delay_s": "5"}, "delay_s"),
    ({"delay_s": True}, "delay_s"),
    ({"priority": "x"}, "priority"),
    ({"priority": 1.0}, "priority"),
    ({"priority": True}, "priority"),
    ({"priority": 10}, "priority"),
    ({"priority": -1}, "priority"),
    ({"queue": ""}, "queue"),
    ({"queue": "a:b"}, "queue"),
    ({"queue": 5}, "queue"),
    ({"eta": "2030-01-01"}, "eta"),
    ({"eta": math.nan}, "eta"),
    ({"eta": math.inf}, "eta"),
    ({"eta": -5.0}, "eta"),
    ({"eta": 1e20}, "eta"),
    ({"max_attempts": 10**14}, "max_attempts"),
    ({"max_attempts": 2**63}, "max_attempts"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"max_attempts": 3.0}, "max_attempts"),
    ({"max_attempts": False}, "max_attempts"),
]

BAD_ARGS: list[tuple[tuple[Any, ...], dict[str, Any], str]] = [
    (({(1, 2): "x"},), {}, "positional argument 0"),
    (("ok", [{"deep": {("t",): 1}}]), {}, "positional argument 1"),
    ((), {"m": ({(1, "a"): 1},)}, "keyword argument 'm'"),
    ((), {"n": [[{(1,): 2}]]}, "keyword argument 'n'"),
]


def _written(fleet: Fleet, queue: str = "default") -> int:
    st = fleet.stats(queue)
    return st.ready + st.delayed + st.reserved + st.dead


@pytest.mark.parametrize(("options", "named"), BAD_OPTIONS,
                         ids=[f"{next(iter(o))}={next(iter(o.values()))!r}"
                              for o, _ in BAD_OPTIONS])
def test_bad_option_is_refused_naming_it(fleet: Fleet, options: dict[str, Any],
                                         named: str) -> None:
    plain = fleet.app.tasks["plain"]
    with pytest.raises((TypeError, ValueError)) as err:
        plain.options(**options).enqueue("t")
    assert named in str(err.value)
    assert repr(next(iter(options.values()))) in str(err.value)
    assert _written(fleet) == 0


@pytest.mark.parametrize(("args", "kwargs", "where"), BAD_ARGS,
                         ids=[w for _, _, w in BAD_ARGS])
def test_dict_key_the_worker_cannot_decode_is_refused(fleet: Fleet, args: tuple[Any, ...],
                                                      kwargs: dict[str, Any],
                                                      where: str) -> None:
    plain = fleet.app.tasks["plain"]
    with pytest.raises(TypeError, match="dict key") as err:
        plain.enqueue(*args, **kwargs)
    assert where in str(err.value)
    assert _written(fleet) == 0


def test_bad_task_settings_are_refused_naming_them() -> None:
    app = batchq.App("redis://127.0.0.1:1/0", namespace="unit")
    for options, named in [({"priority": "x"}, "priority"), ({"max_attempts": 10**14},
                           "max_attempts"), ({"timeout_s": math.nan}, "timeout_s"),
                           ({"retry_backoff_s": math.inf}, "retry_backoff_s"),
                           ({"batch_size": True}, "batch_size"), ({"queue": ""}, "queue")]:
        with pytest.raises((TypeError, ValueError), match=named):
            app.task(name="t", **options)(lambda: None)
    assert app.tasks == {}


def test_enqueue_many_names_the_refused_item_and_writes_nothing_for_it(
        fleet: Fleet) -> None:
    plain = fleet.app.tasks["plain"]
    with pytest.raises(TypeError, match=r"item 3: .*dict key") as err:
        plain.enqueue_many([("a",), ("b",), ("c",), ({(1,): 0},), ("e",)])
    assert getattr(err.value, "written", None) == 0
    assert _written(fleet) == 0

    async def amain() -> None:
        with pytest.raises(TypeError, match=r"item 1: "):
            await plain.aenqueue_many([("a",), ({("k",): 1},)])
        await fleet.app.aclose()

    asyncio.run(amain())
    assert _written(fleet) == 0

    with pytest.raises(ValueError, match="delay_s"):
        plain.options(delay_s=math.nan).enqueue_many([("a",)])
    assert _written(fleet) == 0

    # a mapping row is the keyword arguments: a key that is not a name could never be
    # passed to the handler (it was written, and died on the worker)
    with pytest.raises(TypeError, match=r"item 1: .*keyword 7 \(int\) is not a string"):
        plain.enqueue_many([{"x": 1}, {7: "seven"}])
    assert _written(fleet) == 0


def test_values_at_the_edges_are_accepted_and_run(fleet: Fleet) -> None:
    plain = fleet.app.tasks["plain"]
    tokens = []

    def put(token: str, view: Any, *args: Any, **kwargs: Any) -> None:
        view.enqueue(token, *args, **kwargs)
        tokens.append(token)

    put("max-attempts", plain.options(max_attempts=codec.MAX_ATTEMPTS))
    put("delay-0", plain.options(delay_s=0))
    put("eta-past", plain.options(eta=datetime(2001, 1, 1)))
    put("eta-int", plain.options(eta=1))
    put("prio-9", plain.options(priority=9))
    put("kwargs", plain, secs=0.0)
    plain.enqueue_many([("many-0",), ("many-1",)])
    tokens += ["many-0", "many-1"]
    # int, bytes and None keys come back as themselves: accepted
    fleet.app.tasks["work"].enqueue("nested", 0.0, "", {1: {b"k": [None]}, None: 2})
    tokens.append("nested")
    head = fleet.r.lindex(fleet.app.keys("default").ready_for(0), 0)
    assert head is not None and head.split(b":")[2] == str(codec.MAX_ATTEMPTS).encode()

    fleet.drain("-c", "4")
    report = fleet.check(tokens)
    assert report.valid, report.details()
    assert fleet.stats().dead == 0
    assert fleet.leftovers() == []
