"""Schedules without Redis: cron ticks computed in the schedule's time zone (DST
included), ``every_s`` ticks on the epoch grid, and bad arguments named in the error."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

import batchq
from batchq.produce.periodic import Schedule, schedules

pytestmark = pytest.mark.unit


def ms(text: str, tz: str = "UTC") -> int:
    return round(datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(tz)).timestamp() * 1000)


@pytest.fixture
def app() -> batchq.App:
    return batchq.App("redis://127.0.0.1:1/0", "unit")  # never connects


def test_cron_ticks_in_the_schedule_time_zone(app):
    @app.periodic(cron="0 9 * * *", tz="America/New_York")
    def morning() -> None: ...

    (s,) = schedules(app)
    assert s.text == "cron 0 9 * * * (America/New_York)"
    # winter (EST, UTC-5): 09:00 in New York is 14:00 UTC
    now = ms("2026-11-23T12:00:00")
    assert s.next_tick_ms(now) == ms("2026-11-23T14:00:00")
    assert s.latest_tick_ms(now) == ms("2026-11-22T14:00:00")
    # summer (EDT, UTC-4): 13:00 UTC
    assert s.next_tick_ms(ms("2026-07-01T00:00:00")) == ms("2026-07-01T13:00:00")
    # a tick exactly now is the latest tick, and the next is the one after it
    tick = ms("2026-11-23T14:00:00")
    assert s.latest_tick_ms(tick) == tick
    assert s.next_tick_ms(tick) == ms("2026-11-24T14:00:00")
    assert s.latest_tick_ms(tick - 1) == ms("2026-11-22T14:00:00")


def test_cron_every_five_minutes(app):
    @app.periodic(cron="*/5 * * * *")
    def sweep() -> None: ...

    (s,) = schedules(app)
    now = ms("2026-11-23T12:07:31.250000")
    assert s.latest_tick_ms(now) == ms("2026-11-23T12:05:00")
    assert s.next_tick_ms(now) == ms("2026-11-23T12:10:00")


def test_every_s_ticks_on_the_epoch_grid(app):
    @app.periodic(every_s=30, queue="q2", max_attempts=1)
    def half() -> None: ...

    (s,) = schedules(app)
    assert s.text == "every 30s" and s.queue == "q2"
    assert app.tasks["half"].config.max_attempts == 1  # app.task's options apply
    now = ms("2026-11-23T12:00:44.900000")
    assert s.latest_tick_ms(now) == ms("2026-11-23T12:00:30")
    assert s.next_tick_ms(now) == ms("2026-11-23T12:01:00")
    assert s.latest_tick_ms(ms("2026-11-23T12:01:00")) == ms("2026-11-23T12:01:00")


def test_the_decorated_function_is_a_task(app):
    @app.periodic(every_s=60, name="renamed")
    def f() -> int:
        return 7

    assert app.tasks["renamed"] is f and f() == 7
    assert [s.name for s in schedules(app)] == ["renamed"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "exactly one"),
    ({"cron": "* * * * *", "every_s": 5}, "exactly one"),
    ({"cron": "61 * * * *"}, "invalid cron expression '61 \\* \\* \\* \\*'"),
    ({"cron": "every day"}, "invalid cron expression 'every day'"),
    ({"every_s": 0.5}, "every_s must be .* got 0.5"),
    ({"every_s": float("nan")}, "every_s must be .* got nan"),
    ({"cron": "* * * * *", "tz": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
    ({"every_s": 5, "grace_s": -1}, "grace_s must be >= 0 seconds, got -1"),
])
def test_bad_schedules_are_refused_and_register_nothing(app, kwargs, message):
    with pytest.raises(ValueError, match=message):
        @app.periodic(**kwargs)
        def bad() -> None: ...
    assert "bad" not in app.tasks and schedules(app) == []


def test_a_duplicate_name_is_refused(app):
    @app.task
    def taken() -> None: ...

    with pytest.raises(ValueError, match="'taken' is already registered"):
        @app.periodic(every_s=5)
        def taken() -> None: ...
    assert schedules(app) == []


def test_schedule_is_a_frozen_value(app):
    @app.periodic(every_s=5)
    def f() -> None: ...

    (s,) = schedules(app)
    assert isinstance(s, Schedule)
    with pytest.raises(AttributeError):
        s.every_s = 1  # type: ignore[misc]
