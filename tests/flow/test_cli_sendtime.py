"""``batchq limit set --max-per-*``, ``batchq limit window|window-rm`` and what ``batchq
limit list`` shows of calendar quotas and send windows, through the real ``python -m
batchq``; a bad value exits 2 with one line and writes nothing."""

from __future__ import annotations

import json

import pytest
from fixtures.flow import *  # noqa: F403

import batchq

from .test_cli_limit import APP, cli, env  # noqa: F401  (the fixture)

pytestmark = pytest.mark.e2e


def test_quota_and_window_round_trip(app: batchq.App, queue_name: str,
                                     env: dict[str, str | None]) -> None:  # noqa: F811
    q = app.queue(queue_name)
    app.tasks["work"].options(queue=queue_name, group="acme").enqueue("a")
    res = cli(["limit", "set", APP, queue_name, "--group", "acme", "--rate", "10",
               "--max-per-day", "100000", "--max-per-hour", "9000", "--tz",
               "America/New_York"], env)
    assert "max 9000/hour max 100000/day tz America/New_York" in res.stdout
    (lim,) = q.limits()
    assert (lim.max_per_day, lim.max_per_hour, lim.tz) == (100000, 9000, "America/New_York")
    res = cli(["limit", "window", APP, queue_name, "--group", "acme", "--hours",
               "09:00-12:00", "--hours", "14:00-20:00", "--days", "mon-fri", "--tz",
               "Europe/Paris", "--holiday", "2030-12-25"], env)
    assert "09:00-12:00 mon,tue,wed,thu,fri; 14:00-20:00" in res.stdout
    (w,) = q.windows()
    assert w.group == "acme" and w.tz == "Europe/Paris" and len(w.spans) == 2
    out = cli(["limit", "list", APP, queue_name], env).stdout
    assert "calendar quotas" in out and "send windows" in out and "100000" in out
    data = json.loads(cli(["limit", "list", APP, queue_name, "--json"], env).stdout)
    (row,) = data["limits"]
    assert row["max_per_day"] == 100000 and row["tz"] == "America/New_York"
    assert data["windows"][0]["hours"] == ["09:00-12:00", "14:00-20:00"]
    res = cli(["limit", "window-rm", APP, queue_name, "--group", "acme"], env)
    assert "removed the send window" in res.stdout and q.windows() == []


@pytest.mark.parametrize("args", [
    ["window", "--hours", "9-5"],
    ["window", "--hours", "09:00-17:00", "--days", "caturday"],
    ["window", "--hours", "09:00-17:00", "--tz", "Mars/Base"],
    ["window", "--hours", "09:00-17:00", "--holiday", "tomorrow"],
    ["set", "--group", "g", "--max-per-day", "0"],
    ["set", "--group", "g", "--max-per-month", "-3"],
    ["set", "--group", "g", "--max-per-day", "10", "--tz", "Not/AZone"],
])
def test_bad_values_exit_2_and_write_nothing(app: batchq.App, queue_name: str, args,
                                             env: dict[str, str | None]) -> None:  # noqa: F811
    res = cli(["limit", args[0], APP, queue_name, *args[1:]], env, code=2)
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert app.clients.redis.exists(app.keys(queue_name).limits) == 0
