"""Calendar arithmetic of calendar quotas and send windows, without Redis: period ends
across daylight-saving changes, window openings and closings (overnight, holidays,
skipped times), the boundary-list lookup the pop script repeats, and bad input."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from batchq.flow import calendars as c
from batchq.flow import windows
from batchq.flow.limits import Limit
from batchq.produce.options import EnqueueOptions

pytestmark = pytest.mark.unit

NY = c.zone("America/New_York")
PARIS = c.zone("Europe/Paris")


def ms(*args: int) -> int:
    return c.to_ms(datetime(*args, tzinfo=UTC))


def local(t: int, tz=NY) -> str:
    return c.from_ms(t, tz).strftime("%Y-%m-%d %H:%M %z")


def test_days_follow_the_wall_clock_across_both_changes() -> None:
    spring = c.period_ends(NY, "d", ms(2026, 3, 7, 12), ms(2026, 3, 10))
    assert [local(t) for t in spring[:3]] == [
        "2026-03-08 00:00 -0500", "2026-03-09 00:00 -0400", "2026-03-10 00:00 -0400"]
    assert spring[1] - spring[0] == 23 * c.HOUR_MS  # the spring-forward day
    fall = c.period_ends(NY, "d", ms(2026, 10, 31, 12), ms(2026, 11, 3))
    assert fall[1] - fall[0] == 25 * c.HOUR_MS


def test_hours_on_change_nights() -> None:
    fall = c.period_ends(NY, "h", ms(2026, 11, 1, 4, 30), ms(2026, 11, 1, 8))
    # 00:30 EDT: the repeated 01:00 hour is one period of two hours
    assert [local(t) for t in fall[:3]] == [
        "2026-11-01 01:00 -0400", "2026-11-01 02:00 -0500", "2026-11-01 03:00 -0500"]
    assert fall[1] - fall[0] == 2 * c.HOUR_MS
    spring = c.period_ends(NY, "h", ms(2026, 3, 8, 5, 30), ms(2026, 3, 8, 9))
    # 00:30 EST: 01:00, then 03:00 EDT (02:00 does not exist: no period)
    assert [local(t) for t in spring[:2]] == ["2026-03-08 01:00 -0500",
                                              "2026-03-08 03:00 -0400"]
    assert spring[1] - spring[0] == c.HOUR_MS


def test_half_hour_zone_and_months() -> None:
    kolkata = c.zone("Asia/Kolkata")
    (end,) = c.period_ends(kolkata, "h", ms(2026, 1, 1, 0, 10), ms(2026, 1, 1, 0, 11))
    assert end == ms(2026, 1, 1, 0, 30)  # 06:00 IST
    months = c.period_ends(NY, "M", ms(2026, 1, 31, 12), ms(2026, 4, 1))
    assert [local(t)[:10] for t in months] == ["2026-02-01", "2026-03-01", "2026-04-01"]
    assert c.period_end(NY, "m", ms(2026, 1, 1, 0, 0) + 1) == ms(2026, 1, 1, 0, 1)


def test_windows_overnight_weekdays_and_holidays() -> None:
    w = windows.make_window("g", "22:00-06:00", "mon-fri", "Europe/Paris", ["2026-12-25"])
    edges = c.window_edges(w.spans, PARIS, w.holidays, ms(2026, 12, 23), ms(2026, 12, 29))
    opens = [local(t, PARIS) for t in edges[0::2]]
    closes = [local(t, PARIS) for t in edges[1::2]]
    # the night open at the start counts; no Friday 25th (holiday), no weekend
    assert opens[:4] == ["2026-12-22 22:00 +0100", "2026-12-23 22:00 +0100",
                         "2026-12-24 22:00 +0100", "2026-12-28 22:00 +0100"]
    assert closes[:2] == ["2026-12-23 06:00 +0100", "2026-12-24 06:00 +0100"]
    assert c.window_state(edges, ms(2026, 12, 23, 22)) == (True, edges[3])  # 23:00 Paris
    assert c.window_state(edges, ms(2026, 12, 24, 12)) == (False, edges[4])


def test_several_ranges_merge_and_a_skipped_opening_moves_to_the_gap_end() -> None:
    w = windows.make_window(None, ["09:00-12:00", "11:00-14:00"], "daily", "UTC", None)
    edges = c.window_edges(w.spans, c.zone("UTC"), (), ms(2026, 1, 1), ms(2026, 1, 1, 23))
    assert edges[:2] == [ms(2026, 1, 1, 9), ms(2026, 1, 1, 14)]
    w = windows.make_window(None, "02:30-05:00", "daily", "America/New_York", None)
    edges = c.window_edges(w.spans, NY, (), ms(2026, 3, 8, 4), ms(2026, 3, 8, 12))
    assert local(edges[0]) == "2026-03-08 03:00 -0400"  # 02:30 does not exist that day
    assert c.next_open(w.spans, NY, (), ms(2026, 3, 8, 8)) == ms(2026, 3, 8, 8)  # open


def test_list_lookup_matches_what_the_script_does() -> None:
    ends = c.period_ends(NY, "d", ms(2026, 1, 1), ms(2026, 1, 10))
    text = c.encode_list(c.DAY_MS, ends)
    cycle, back = c.decode_list(text)
    assert back == ends and cycle == c.DAY_MS
    assert c.list_next(cycle, ends, ends[0] - 1) == (ends[0], 1)
    assert c.list_next(cycle, ends, ends[3]) == (ends[4], 5)
    # past the end: whole cycles are added
    assert c.list_next(cycle, ends, ends[-1] + 5) == (ends[-1] + c.DAY_MS, len(ends))


def test_bad_input_is_refused_with_the_name() -> None:
    for bad in ("9-17", "25:00-26:00", "09:00-09:00", "09:60-10:00", 9):
        with pytest.raises(ValueError, match="hours"):
            c.parse_hours(bad)
    for bad in ("", "funday", "mon-", 5):
        with pytest.raises(ValueError, match="days"):
            c.parse_days(bad)
    with pytest.raises(ValueError, match="time zone"):
        c.zone("Mars/Olympus")
    with pytest.raises(ValueError, match="holiday"):
        c.parse_holidays(["2026-13-01"])
    with pytest.raises(ValueError, match="max_per_day"):
        Limit("g", max_per_day=0)
    with pytest.raises(ValueError, match="max_per_hour"):
        Limit("g", max_per_hour=-5)
    with pytest.raises(ValueError, match="time zone"):
        Limit("g", max_per_day=5, tz="Nowhere/Land")
    with pytest.raises(ValueError, match="tz needs"):
        Limit("g", rate_per_s=1, tz="UTC")
    assert c.parse_days("fri-mon") == frozenset({4, 5, 6, 0})
    assert c.parse_hours("00:00-24:00") == (0, 1440)


def test_a_per_job_window_is_a_delayed_start_at_the_next_opening() -> None:
    after = datetime(2026, 6, 1, 21, 0, tzinfo=UTC).timestamp()  # 23:00 in Paris
    o = EnqueueOptions(not_before=after, window="09:00-20:00 mon-fri", tz="Europe/Paris")
    assert o.eta == ms(2026, 6, 2, 7) / 1000 and o.delay_s is None  # Tue 09:00 Paris
    inside = datetime(2026, 6, 2, 8, 0, tzinfo=UTC).timestamp()
    assert EnqueueOptions(eta=inside, window="09:00-20:00", tz="Europe/Paris").eta == inside
    with pytest.raises(ValueError, match="tz needs"):
        EnqueueOptions(tz="UTC")
    with pytest.raises(ValueError, match="hours"):
        EnqueueOptions(window="soon")
    assert date(2026, 6, 2).weekday() == 1
