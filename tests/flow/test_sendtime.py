"""Calendar quotas and send windows with real workers: a daily quota is never exceeded
by two supervisors (one with two workers) and starts again when its period ends; a
quiet-hours group starts at its opening while another group runs; idle workers do not
pop while every group waits for its window; limits, windows and their use read back.

Period ends and openings a few seconds away are stored with ``windows.pin_list`` (the
lists Python computes for the pop script), not by waiting for midnight."""

from __future__ import annotations

import time

import pytest
import redis
from fixtures.flow import *  # noqa: F403
from helpers import wait_until

import batchq
from batchq.flow import calendars, windows
from batchq.flow import view as flow_view
from batchq.flow.limits import group_hex

pytestmark = pytest.mark.integration


def _server_ms(r: redis.Redis) -> int:
    return windows.server_ms(r)


def _script_calls(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(int(v["calls"]) for name, v in stats.items()
               if name in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall"))


@pytest.mark.timeout(120)
def test_daily_quota_holds_across_supervisors_and_resets(app, queue_name, start_worker,
                                                         runs):
    q = app.queue(queue_name)
    q.limit(group="acme", max_per_day=30, rate_per_s=500, tz="America/New_York")
    r = app.clients.redis
    k = app.keys(queue_name)
    reset_ms = _server_ms(r) + 7000
    windows.pin_list(r, k, "@d:America/New_York",
                     [reset_ms, reset_ms + 400 * calendars.DAY_MS], calendars.DAY_MS)
    work = app.tasks["work"].options(queue=queue_name)
    work.options(group="acme").enqueue_many([(f"a{i}",) for i in range(50)])
    work.options(group="free").enqueue_many([(f"f{i}",) for i in range(40)])
    # small pops, so that the jobs (and the period's first pops after the reset) spread
    # over the three processes: a pop of 100 would take every ready job at once
    start_worker(queue_name, "-p", "2", "-c", "10", "--fetch-batch", "1")
    start_worker(queue_name, "-c", "10", "--fetch-batch", "1")

    def acme() -> list[float]:
        return [x.start for x in runs() if x.token.startswith("a")]

    wait_until(lambda: len(acme()) >= 30 and len(runs()) >= 70, timeout_s=30,
               message="the quota's 30 jobs and the free group ran")
    use = {u.limit.group: u for u in flow_view.read(r, [k])[queue_name].limits}
    assert [(w.window, w.used, w.limit) for w in use["acme"].windows] == [("day", 30, 30)]
    assert q.groups()[0].why == "quota" and q.groups()[0].state == "waiting"
    left_s = (reset_ms - _server_ms(r)) / 1000
    assert left_s > 0.5, "the machine is too slow for this test's period"
    time.sleep(left_s - 0.3)
    assert len(acme()) == 30  # never a 31st before the period ended
    wait_until(lambda: len(acme()) == 50, timeout_s=20,
               message="the rest started in the next period")
    after = sorted(acme())[30:]
    assert min(after) * 1000 >= reset_ms - 50  # server and handler clocks: one machine
    assert min(after) * 1000 < reset_ms + 3000  # the wait was timed, not a poll
    assert len({x.pid for x in runs()}) >= 2
    counted = r.hget(k.gstate, f"{group_hex('acme')}|d")
    assert counted is not None and counted.decode().endswith(":20")


@pytest.mark.timeout(90)
def test_quiet_hours_group_starts_at_its_opening(app, queue_name, start_worker, runs):
    q = app.queue(queue_name)
    r = app.clients.redis
    k = app.keys(queue_name)
    w = q.window(group="quiet", hours="09:00-20:00", days="mon-fri", tz="Europe/Paris")
    q.limit(group="quiet", rate_per_s=20, burst=1)  # the opening is not a herd
    open_ms = _server_ms(r) + 4000
    windows.pin_list(r, k, w.list_field(), [open_ms, open_ms + 600_000,
                                            open_ms + 7 * calendars.DAY_MS,
                                            open_ms + 7 * calendars.DAY_MS + 600_000],
                     calendars.WEEK_MS)
    work = app.tasks["work"].options(queue=queue_name)
    work.options(group="quiet").enqueue_many([(f"q{i}",) for i in range(10)])
    work.options(group="loud").enqueue_many([(f"l{i}",) for i in range(20)])
    start_worker(queue_name, "-c", "10")
    wait_until(lambda: sum(x.token.startswith("q") for x in runs()) == 10, timeout_s=30,
               message="the quiet group ran after its opening")
    quiet = sorted(x.start for x in runs() if x.token.startswith("q"))
    loud = [x.start for x in runs() if x.token.startswith("l")]
    assert len(loud) == 20 and max(loud) * 1000 < open_ms  # the other group did not wait
    assert quiet[0] * 1000 >= open_ms - 50 and quiet[0] * 1000 < open_ms + 2500
    assert quiet[-1] - quiet[0] >= (10 - 1) / 20 - 0.1  # its own rate applied
    assert [x.group for x in q.windows()] == ["quiet"]


@pytest.mark.timeout(90)
def test_idle_workers_do_not_pop_while_every_group_is_outside_its_window(
        app, queue_name, start_worker, runs):
    q = app.queue(queue_name)
    r = app.clients.redis
    k = app.keys(queue_name)
    w = q.window(group="*", hours="22:00-06:00", tz="UTC")
    proc = start_worker(queue_name, "-p", "2", "-c", "10")
    time.sleep(1.0)
    open_ms = _server_ms(r) + 4500
    windows.pin_list(r, k, w.list_field(), [open_ms, open_ms + 600_000,
                                            open_ms + 7 * calendars.DAY_MS,
                                            open_ms + 7 * calendars.DAY_MS + 600_000],
                     calendars.WEEK_MS)
    work = app.tasks["work"].options(queue=queue_name)
    for g in ("a", "b", "c"):
        work.options(group=g).enqueue_many([(f"{g}{i}",) for i in range(5)])
    time.sleep(0.8)  # the enqueue's wake-up: one pop parks the groups until the opening
    before = _script_calls(r)
    time.sleep(max(0.0, (open_ms - _server_ms(r)) / 1000 - 0.4))
    during = _script_calls(r) - before
    assert runs() == []
    assert during == 0, f"{during} script calls while every group was outside its window"
    wait_until(lambda: len(runs()) == 15, timeout_s=20, message="all ran at the opening")
    assert min(x.start for x in runs()) * 1000 >= open_ms - 50
    assert {x.group for x in runs()} == {group_hex(g) for g in "abc"}
    assert proc.poll() is None


def test_windows_change_and_read_back(app, queue_name, start_worker, runs):
    q = app.queue(queue_name)
    r = app.clients.redis
    k = app.keys(queue_name)
    q.window(group="late", hours="22:00-06:00", tz="UTC")
    w = q.window(group="late", hours="22:00-06:00", tz="UTC")
    windows.pin_list(r, k, w.list_field(), [_server_ms(r) + 3_600_000,
                                            _server_ms(r) + 7_200_000], calendars.WEEK_MS)
    app.tasks["work"].options(queue=queue_name, group="late").enqueue_many(
        [(f"z{i}",) for i in range(5)])
    proc = start_worker(queue_name, "-c", "5")
    wait_until(lambda: any(g.state == "waiting" for g in q.groups()), timeout_s=10,
               message="the group waits for its window")
    (g,) = q.groups()
    assert g.why == "window" and g.until_s > 3000
    assert runs() == []
    assert q.remove_window(group="late") is True  # applies to the jobs already queued
    wait_until(lambda: len(runs()) == 5, timeout_s=10, message="they ran once removed")
    assert q.windows() == [] and q.remove_window(group="late") is False
    assert r.hget(k.limits, w.list_field()) is None  # its list went with it
    assert proc.poll() is None


def test_bad_windows_and_quotas_write_nothing(app, queue_name):
    q = app.queue(queue_name)
    r = app.clients.redis
    k = app.keys(queue_name)
    for kwargs in ({"hours": "9-5"}, {"hours": "09:00-17:00", "days": "someday"},
                   {"hours": "09:00-17:00", "tz": "Atlantis/Capital"},
                   {"hours": "09:00-17:00", "holidays": ["2026-02-30"]}):
        with pytest.raises(ValueError):
            q.window(group="g", **kwargs)
    with pytest.raises(ValueError, match="max_per_day"):
        q.limit(group="g", max_per_day=0)
    with pytest.raises(ValueError, match="time zone"):
        q.limit(group="g", max_per_day=10, tz="Europe/Atlantis")
    assert r.exists(k.limits) == 0
    lim = q.limit(group="g", max_per_hour=100, max_per_month=1000, tz="Asia/Tokyo")
    assert q.limits() == [lim] and lim.describe().endswith("tz Asia/Tokyo")
    assert batchq.Limit is type(lim)


def test_window_used_metric_only_for_limits_with_quotas(app, queue_name):
    from batchq.flow import metrics as flow_metrics

    q = app.queue(queue_name)
    q.limit(group="acme", max_per_day=100, max_per_minute=10, tz="Europe/Paris")
    q.limit(group="*", max_per_hour=50)       # counts per group: no series of its own
    q.limit(group="plain", rate_per_s=5)      # no quota: no series
    q.limit(max_per_month=1000)               # the queue's own: group=""
    r = app.clients.redis
    k = app.keys(queue_name)
    work = app.tasks["work"].options(queue=queue_name)
    work.options(group="acme").enqueue_many([(f"a{i}",) for i in range(15)])
    from batchq.store.scripts import calls

    popped = app.clients.sync_scripts.call(calls.pop(k, 100, 60_000, 100))
    assert len(popped) - 11 == 10  # the minute quota cut the pop
    fams = {f.name: f for f in flow_metrics.limit_families(r, {queue_name: [k]})}
    got = {(s.labels["group"], s.labels["window"]): s.value
           for s in fams["batchq_group_window_used"].samples}
    assert got == {("acme", "minute"): 10, ("acme", "day"): 10, ("", "month"): 10}
    assert flow_view.read(r, [k])[queue_name].limits_total == 4  # lists are not limits


def test_lists_running_low_are_written_again_by_a_read(app, queue_name):
    q = app.queue(queue_name)
    r = app.clients.redis
    k = app.keys(queue_name)
    w = q.window(group="g", hours="09:00-17:00", tz="Europe/Paris")
    q.limit(group="g", max_per_day=10, tz="Europe/Paris")
    now = _server_ms(r)
    windows.pin_list(r, k, w.list_field(), [now + 1000, now + 2000], calendars.WEEK_MS)
    windows.pin_list(r, k, "@d:Europe/Paris", [now + 1000], calendars.DAY_MS)
    q.windows()  # batchq limit list and the console read through it
    for name, horizon in ((w.list_field(), "w"), ("@d:Europe/Paris", "d")):
        _, edges = calendars.decode_list(r.hget(k.limits, name).decode())
        assert edges[-1] - now > calendars.HORIZON_MS[horizon] * 0.9
